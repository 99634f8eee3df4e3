"""Jump-forward: turn a forced continuation string into the tokens the tokenizer would produce.

Appending the forced text as the model's own tokens would hand it token splits it never saw in
training, and its next choices drift. So the forced text is joined to the trailing output tokens of
the same pre-token (BPE never merges across pre-tokens), that span is re-tokenized canonically, and
the last pre-token is kept back: the model's next token may still merge with it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from ..config import JUMP_FORWARD_MAX_ROLLBACK
from ..tokenizer import Tokenizer


@dataclass(slots=True)
class JumpPlan:
    rollback: int  # trailing output tokens to drop
    tokens: list[int]  # canonical tokens to append after dropping them


class JumpForwarder:
    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self._pre = tokenizer.hf.pre_tokenizer

    def plan(self, output_ids: list[int], token_bytes: Callable[[int], bytes], forced: bytes,
             final: bool) -> JumpPlan | None:
        """How to append `forced` after `output_ids`; None when nothing can be gained safely.

        `final`: nothing but EOS can follow the forced text, so its last pre-token need not wait.
        """
        if not forced or self._pre is None:
            return None
        span = self._tail(output_ids, token_bytes, forced)
        if span is None:
            return None
        taken, tail, text = span
        junction = len(tail)
        if len(text.encode()) <= junction:
            return None
        starts = [len(text[:a].encode()) for _, (a, _b) in self._pre.pre_tokenize_str(text)]
        # re-tokenize from the start of the pre-token that holds the junction
        begin = max((s for s in starts if s <= junction), default=0)
        if begin == 0 and taken < len(output_ids) and junction > 0:
            return None  # that pre-token may reach further back than we looked
        bounds = _token_starts(output_ids[len(output_ids) - taken:], token_bytes)
        cut_token = max(i for i, b in enumerate(bounds) if b <= begin)
        begin = bounds[cut_token]
        end = len(text.encode()) if final else max(starts)
        if end <= junction:
            return None
        data = text.encode()[begin:]
        kept = data[: end - begin].decode()
        tokens = self.tokenizer.encode(kept, add_special_tokens=False)
        whole = self.tokenizer.encode(data.decode(), add_special_tokens=False)
        if whole[: len(tokens)] != tokens or b"".join(token_bytes(t) for t in tokens) != kept.encode():
            return None  # the split depends on what follows: leave it to the model
        return JumpPlan(rollback=taken - cut_token, tokens=tokens)

    @staticmethod
    def _tail(output_ids: list[int], token_bytes: Callable[[int], bytes],
              forced: bytes) -> tuple[int, bytes, str] | None:
        """(tokens looked back at, their bytes, their text + the forced text up to its last whole
        character), starting on a character boundary."""
        for taken in range(min(len(output_ids), JUMP_FORWARD_MAX_ROLLBACK), -1, -1):
            tail = b"".join(token_bytes(t) for t in output_ids[len(output_ids) - taken:])
            try:
                return taken, tail, _whole_chars(tail + forced).decode()
            except UnicodeDecodeError:
                continue
        return None


def _token_starts(ids: list[int], token_bytes: Callable[[int], bytes]) -> list[int]:
    out, pos = [0], 0
    for t in ids:
        pos += len(token_bytes(t))
        out.append(pos)
    return out


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
