"""A DFA over all 256 bytes whose rows are built on first reach (a lazily glued automaton).

Some rows start unbuilt (token_index.Unbuilt): the first token walk, byte walk, closing walk or
jump-forward that reaches one asks the subclass to build it (`_build`), which may append rows. Built
rows never change, so kept masks and matchers' states stay valid as the table grows. Used where the
whole automaton is too large to build (a structural tag's tools: tag_dispatch; objects whose members
take any order: object_dispatch) and a decode visits a small share of it.
"""
from __future__ import annotations

import numpy as np

from ..config import JUMP_FORWARD_MAX_BYTES
from .masks.token_index import Unbuilt
from .matcher import RegexConstraint

# Rows a cached constraint may grow to (256 int32 columns each: 64 MB at 65,536) before the compiler stops
# handing it out and compiles a fresh one: requests over time visit ever more of the exact automaton
# (2^n member sets), and a long-lived server must not keep all of it. Requests holding the old one finish on it.
MAX_GROWN_STATES = 65_536


class GrowingDfa(RegexConstraint):
    """`self.dfa` (256 columns), `self.unbuilt` (bool per state) and `self.index` are set by the
    subclass, which builds unbuilt rows in `_build` (replacing them in that order: unbuilt marks, then
    the table, then its index, unless the index reads the growing buffers themselves: object_dispatch)."""

    unbuilt: np.ndarray

    def _build(self, states: int | list[int] | np.ndarray) -> None:
        raise NotImplementedError

    @property
    def outgrown(self) -> bool:
        """Whether the table passed MAX_GROWN_STATES rows: the compiler's cache then builds a fresh one."""
        return self.grown_share > 1

    @property
    def grown_share(self) -> float:
        """Its rows as a share of MAX_GROWN_STATES (warming.py stops at a fraction of it)."""
        return len(self.unbuilt) / MAX_GROWN_STATES

    def _built(self, state: int) -> int:
        if self.unbuilt[state]:
            self._build(state)
        return state

    def _before_walk(self, state: int) -> None:
        """Builds ahead what a token walk from the built `state` will reach (a subclass that knows it saves the
        walk that stops at an unbuilt row, voided, and is walked again)."""

    def _packed(self, state: int) -> np.ndarray:
        self._built(state)
        if not self.index.holds(state):
            self._before_walk(state)
        while True:
            try:
                return self.index.packed(state)
            except Unbuilt as e:
                self._build(e.states)

    # ---- the Constraint protocol ------------------------------------------------------------------
    def advance(self, state: int, token_id: int) -> int | None:
        bits = self._packed(state)  # and every row a token from here reaches is built
        if not bits[token_id >> 3] >> (token_id & 7) & 1:
            return None
        return self.advance_bytes(state, self.vocab.bytes_of(token_id))

    def advance_bytes(self, state: int, data: bytes) -> int | None:
        for b in data:
            self._built(state)  # before reading self.dfa: building replaces it
            state = self.dfa.step(state, b)
            if state < 0:
                return None
        return state

    def allowed(self, state: int) -> np.ndarray:
        return np.unpackbits(self._packed(state), count=self.vocab.size, bitorder="little").view(bool)

    def allowed_bits(self, state: int) -> np.ndarray:
        return self._packed(state)

    def can_end(self, state: int) -> bool:
        return bool(self.dfa.accept[self._built(state)] >= 0)

    def _row(self, state: int) -> np.ndarray:
        self._built(state)  # the closing walk may reach a row not built yet
        return self.dfa.row(state)

    def forced_bytes(self, state: int, limit: int = JUMP_FORWARD_MAX_BYTES) -> bytes:
        out = b""
        while more := super().forced_bytes(self._built(state), limit - len(out)):  # stops at an unbuilt row
            out += more
            nxt = self.advance_bytes(state, more)
            assert nxt is not None, "forced bytes are allowed bytes"
            state = nxt
        return out
