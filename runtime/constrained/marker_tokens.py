"""Special tokens that spell a structural tag's markers, allowed where their text is.

A constraint's vocabulary leaves special tokens out: a constrained output must not close its turn or
open a role by accident. But some tool-call formats mark a call with one special token, as their
models were trained to write it: Mistral's `[TOOL_CALLS]`, Qwen's `<tool_call>` / `</tool_call>` where
a vocabulary (GGUF's) marks them special. Such a model writes the token, never its text spelled out
byte by byte. So a special token whose text occurs in one of a tag's markers (trigger, begin, end,
separator) is allowed wherever the constraint allows its text, and reading it reads that text. Its
text is then kept in the output (engine.create_req), where the tool-call parser looks for it.
"""
from __future__ import annotations

from typing import Hashable

import numpy as np

from .closing import shortest_close
from .masks.vocab import TokenVocab
from .matcher import Constraint, MaskCache
from .structural_tag import StructuralTag


def marker_tokens(tag: StructuralTag, vocab: TokenVocab) -> dict[int, bytes]:
    """The special tokens (EOS aside) whose text occurs in one of the tag's markers, with that text."""
    markers = [m.encode() for t in tag.tags for m in (t.begin, t.end)] + [m.encode() for m in tag.triggers or ()]
    markers.append(tag.separator.encode())
    return {i: vocab.token_bytes[i] for i in vocab.special_ids
            if i not in vocab.end_ids and any(vocab.token_bytes[i] in m for m in markers)}


def with_marker_tokens(constraint: Constraint, tag: StructuralTag) -> Constraint:
    """`constraint`, allowing the tag's marker tokens (itself when the vocabulary has none)."""
    markers = marker_tokens(tag, constraint.vocab)
    return MarkerTokens(constraint, markers) if markers else constraint


class MarkerTokens:
    """A constraint whose masks also allow marker tokens where their text may come next."""

    def __init__(self, inner: Constraint, markers: dict[int, bytes]):
        self.inner, self.markers, self.vocab = inner, markers, inner.vocab
        self.keeps_marker_text = True  # the detokenizer keeps the marker tokens' text (engine.create_req)
        self._masks = MaskCache()

    def initial(self) -> Hashable:
        return self.inner.initial()

    def advance(self, state: Hashable, token_id: int) -> Hashable | None:
        text = self.markers.get(token_id)
        if text is None:
            return self.inner.advance(state, token_id)
        return self.inner.advance_bytes(state, text)

    def advance_bytes(self, state: Hashable, data: bytes) -> Hashable | None:
        return self.inner.advance_bytes(state, data)

    def allowed(self, state: Hashable) -> np.ndarray:
        return self._masks.get(state, lambda: self._mask(state)).copy()

    def allowed_bits(self, state: Hashable) -> np.ndarray:
        return self._masks.get_bits(state, lambda: self._mask(state))

    def can_end(self, state: Hashable) -> bool:
        return self.inner.can_end(state)

    def forced_bytes(self, state: Hashable, limit: int) -> bytes:
        return self.inner.forced_bytes(state, limit)

    def closing_bytes(self, state: Hashable, limit: int, nonempty: bool = False) -> bytes | None:
        return shortest_close(self.inner, state, limit, nonempty)

    def _mask(self, state: Hashable) -> np.ndarray:
        mask = self.inner.allowed(state)
        for token_id, text in self.markers.items():
            mask[token_id] = self.inner.advance_bytes(state, text) is not None
        return mask
