"""Jump-forward drafts: a forced continuation string as the tokens the tokenizer would produce.

When the constraint admits exactly one continuation, its text is split canonically (tokenizer
output, never a made-up split) and appended as a *draft*: the next step computes all of it in one
extend and the scheduler keeps each drafted token only if sampling at its position reproduces it
(greedy: the argmax; sampling: a draw, which keeps the distribution exact). A rejected token and
everything after it are rolled back, KV included. So jump-forward saves decode steps and can never
change the output: models often split forced text differently from the tokenizer (e.g. `{` + `"`
rather than `{"` in compact JSON), and appending those splits unverified is what made outputs drift.

The last pre-token of the forced text is held back (the model's next token may merge with it),
unless only EOS can follow.
"""
from __future__ import annotations

from ..tokenizer import Tokenizer


class JumpForwarder:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._pre = tokenizer.hf.pre_tokenizer

    def draft(self, forced: bytes, final: bool) -> list[int]:
        """Canonical tokens for a prefix of `forced` (the whole of it when `final`)."""
        if not forced or forced[0] & 0xC0 == 0x80:  # it completes a character the model began
            return []
        text = _whole_chars(forced).decode()
        end = len(text)
        if not final and self._pre is not None and text:
            end = self._pre.pre_tokenize_str(text)[-1][1][0]  # start of the last pre-token
        if end == 0:
            return []
        tokens = self.tokenizer.encode(text[:end], add_special_tokens=False)
        whole = self.tokenizer.encode(text, add_special_tokens=False)
        while tokens and whole[: len(tokens)] != tokens:  # a split that depends on what follows
            tokens.pop()
        return tokens


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
