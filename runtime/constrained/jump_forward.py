"""Jump-forward drafts: a forced continuation string as the tokens the tokenizer would produce.

When the constraint admits exactly one continuation, its text is split canonically (tokenizer
output, never a made-up split) and appended as a *draft*. The next step computes all of it in one
extend, and the scheduler keeps each drafted token only if sampling at its position reproduces it
(greedy: the argmax; sampling: a draw, which keeps the distribution exact). At the first mismatch
the model's own token is kept instead and the rest of the draft is rolled back, KV included.

So jump-forward saves decode steps but never changes the output. Models often split forced text
differently from the tokenizer (in compact JSON SmolLM2 writes `{` + `"` rather than `{"`, and
`",` + `"` rather than `","`); appending canonical splits unverified is what made outputs drift.
Verification also settles the boundary: if the model's next token would merge with the draft's
last one (`":` + `"` -> `":"`), it is the model's token that is kept, so nothing is held back.
"""
from __future__ import annotations

from ..tokenizer import Tokenizer


class JumpForwarder:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer

    def draft(self, forced: bytes) -> list[int]:
        """Canonical tokens for `forced`, up to its last whole UTF-8 character."""
        if not forced or forced[0] & 0xC0 == 0x80:  # it completes a character the model began
            return []
        text = _whole_chars(forced).decode()
        return self.tokenizer.encode(text, add_special_tokens=False) if text else []


def _whole_chars(data: bytes) -> bytes:
    """`data` without a trailing incomplete UTF-8 character."""
    lead = len(data) - 1
    while lead >= 0 and len(data) - lead < 4 and data[lead] & 0xC0 == 0x80:
        lead -= 1
    if lead < 0:
        return data
    b = data[lead]
    width = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4
    return data[:lead] if lead + width > len(data) else data
