"""Think, then constrain: a reasoning model's free thinking block, its end marker and the answer's
constraint as one constraint, with an optional budget of thinking tokens.

The output is `[start] thinking end answer`: the start marker when the prompt has not opened the block
(forced: with a constraint or a budget the model thinks first), free text containing no end marker, the
end marker, then the answer under the inner constraint (JSON schema, tool calls, regex, grammar; or free
text when there is none). A state is (phase, sub-state, thinking tokens spent). Each phase walks an
automaton of its own, built once per marker and vocabulary and shared by every request:
- OPEN: the start marker as a literal DFA (forced bytes: jump-forward writes it);
- THINK: structural tags' free text up to the end marker (tag_dispatch.FreeText: its token masks are
  shared with tool-call constraints that use the same trigger);
- CLOSE: the rest of the end marker, from where the thinking text left it, as a literal DFA. The budget
  moves THINK to CLOSE: at `budget` thinking tokens the only continuation is the marker, so the engine
  closes the block itself (jump-forward drafts it with the answer's forced start);
- ANSWER: the inner constraint's states.
A token may cross phases (a draft of "</think>{" does): its bytes walk on through the next phase.
Special tokens that spell a marker (a vocabulary that marks `</think>` special) read as the marker.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import numpy as np

from ..config import JUMP_FORWARD_MAX_BYTES
from .closing import shortest_close
from .masks.vocab import TokenVocab
from .matcher import Constraint, MaskCache, RegexConstraint
from .regex import regex_ast as ra
from .regex.automaton import compile_dfa
from .tag_dispatch import FreeText

OPEN, THINK, CLOSE, ANSWER = 0, 1, 2, 3
State = tuple[int, Hashable, int]  # (phase, sub-state, thinking tokens so far)


class Literal:
    """One marker text as a constraint of its own (its DFA's last state completes it)."""

    def __init__(self, text: bytes, vocab: TokenVocab):
        self.text = text
        self.constraint = RegexConstraint(compile_dfa([ra.literal(text.decode())]), vocab)
        self.done = int(np.flatnonzero(self.constraint.dfa.accept >= 0)[0])


@dataclass
class ThinkParts:
    """The shared automata for one (start, end) marker pair and vocabulary."""

    start: Literal
    end_rests: list[Literal]  # end marker from each depth: end_rests[k] spells end[k:]
    free: FreeText
    depth: dict[int, int]  # FreeText state -> how much of the end marker its text ends in

    @classmethod
    def build(cls, start: str, end: str, vocab: TokenVocab) -> "ThinkParts":
        free = FreeText(end, vocab)
        raw = end.encode()
        depth: dict[int, int] = {}
        for k in range(len(raw)):
            state = free.dfa.walk(free.dfa.start, raw[:k])
            depth.setdefault(state, k)
        return cls(Literal(start.encode(), vocab), [Literal(raw[k:], vocab) for k in range(len(raw))], free, depth)


class ThinkThen:
    """The constraint described in the module doc; `inner` None leaves the answer free."""

    def __init__(self, parts: ThinkParts, inner: Constraint | None, budget: int | None, opened: bool,
                 vocab: TokenVocab):
        self.parts, self.inner, self.budget, self.opened, self.vocab = parts, inner, budget, opened, vocab
        texts = {parts.start.text, parts.end_rests[0].text}
        self.markers = {i: vocab.token_bytes[i] for i in vocab.special_ids
                        if i not in vocab.end_ids and vocab.token_bytes[i] in texts}
        self._masks = MaskCache()
        # the detokenizer keeps special tokens' text when a marker is one (the reply is split on it)
        self.keeps_marker_text = bool(self.markers) or getattr(inner, "keeps_marker_text", False)
        self._free_bits: np.ndarray | None = None

    # ---- the Constraint protocol ------------------------------------------------------------------
    def initial(self) -> State:
        if self.opened:
            return self._thinking(self.parts.free.dfa.start, 0)
        return OPEN, self.parts.start.constraint.initial(), 0

    def advance(self, state: State, token_id: int) -> State | None:
        phase, sub, spent = state
        if phase == ANSWER:
            if self.inner is None:
                return state
            nxt = self.inner.advance(sub, token_id)
            return None if nxt is None else (ANSWER, nxt, spent)
        data = self.markers.get(token_id)
        if data is None:
            if token_id in self.vocab.special_ids or token_id >= len(self.vocab.token_bytes):
                return None
            data = self.vocab.token_bytes[token_id]
        if not data:
            return None
        return self._walk(state, data, count=True)

    def advance_bytes(self, state: State, data: bytes) -> State | None:
        return self._walk(state, data, count=False)

    def allowed(self, state: State) -> np.ndarray:
        return np.unpackbits(self.allowed_bits(state), count=self.vocab.size, bitorder="little").view(bool).copy()

    def allowed_bits(self, state: State) -> np.ndarray:
        phase, sub, _ = state
        if phase == ANSWER:
            return self.inner.allowed_bits(sub) if self.inner is not None else self._all_bits()
        if phase == THINK:
            base = self.parts.free.exact.packed(int(sub))  # type: ignore[call-overload]
        else:
            base = self._literal(phase, sub).constraint.allowed_bits(self._literal_state(sub))
        if not self.markers:
            return base
        return self._masks.get_bits((phase, sub), lambda: self._with_markers(state, base))

    def can_end(self, state: State) -> bool:
        phase, sub, _ = state
        return phase == ANSWER and (self.inner is None or self.inner.can_end(sub))

    def forced_bytes(self, state: State, limit: int = JUMP_FORWARD_MAX_BYTES) -> bytes:
        out = b""
        while len(out) < limit:
            phase, sub, _ = state
            if phase == THINK:
                break
            if phase == ANSWER:
                if self.inner is not None:
                    out += self.inner.forced_bytes(sub, limit - len(out))
                break
            more = self._literal(phase, sub).constraint.forced_bytes(self._literal_state(sub), limit - len(out))
            if not more:
                break
            nxt = self._walk(state, more, count=False)
            assert nxt is not None, "forced bytes are allowed bytes"
            out, state = out + more, nxt
        return out

    def closing_bytes(self, state: State, limit: int, nonempty: bool = False) -> bytes | None:
        """The shortest completion (closing.py): the rest of the block's markers, then the answer's; None
        with a free answer (nothing to keep valid: a cut stays a cut)."""
        if self.inner is None:
            return None
        phase, sub, _ = state
        head = b""
        if phase == THINK:
            k = self.parts.depth.get(int(sub))  # type: ignore[call-overload]
            if k is None:  # inside a UTF-8 character: the next token completes it first
                return None
            head = self.parts.end_rests[k].text
        elif phase != ANSWER:
            head = self._literal(phase, sub).constraint.forced_bytes(self._literal_state(sub), limit)
            if phase == OPEN:
                head += self.parts.end_rests[0].text
        answer = self._walk(state, head, count=False) if head else state
        if answer is None or answer[0] != ANSWER:
            return None
        rest = shortest_close(self.inner, answer[1], limit - len(head), nonempty and not head)
        return None if rest is None else head + rest

    # ---- walking ------------------------------------------------------------------------------------
    def _walk(self, state: State, data: bytes, count: bool) -> State | None:
        phase, sub, spent = state
        i = 0
        while i < len(data) and phase != ANSWER:
            if phase == THINK:
                dfa = self.parts.free.dfa
                s = dfa.step(int(sub), data[i])  # type: ignore[call-overload]
                i += 1
                if s < 0:
                    return None
                if dfa.accept[s] == 1:  # the end marker completed
                    phase, sub = ANSWER, self._inner_initial()
                else:
                    sub = s
                continue
            lit = self._literal(phase, sub)
            s = lit.constraint.dfa.step(self._literal_state(sub), data[i])
            i += 1
            if s < 0:
                return None
            if s != lit.done:
                sub = (sub[0], s) if phase == CLOSE else s  # type: ignore[index]
            elif phase == OPEN:
                phase, sub, spent = THINK, self.parts.free.dfa.start, 0
            else:
                phase, sub = ANSWER, self._inner_initial()
        if phase == ANSWER:
            rest = data[i:]
            if rest and self.inner is not None:
                sub = self.inner.advance_bytes(sub, rest)
                if sub is None:
                    return None
            return ANSWER, sub, spent
        if phase == THINK:
            if count and state[0] == THINK:  # a thinking token (not the one that wrote the start marker)
                spent += 1
            return self._thinking(int(sub), spent)  # type: ignore[call-overload]
        return phase, sub, spent

    def _thinking(self, free_state: int, spent: int) -> State:
        """A thinking state, or (the budget spent) the state that closes the block from here."""
        if self.budget is not None and spent >= self.budget:
            k = self.parts.depth.get(free_state)
            # None: the text stops inside a UTF-8 character (byte-level tokens may split one): the block
            # closes after the token that completes it
            if k is not None:
                return CLOSE, (k, self.parts.end_rests[k].constraint.initial()), spent
        return THINK, free_state, spent

    def _inner_initial(self) -> Hashable:
        return self.inner.initial() if self.inner is not None else None

    def _literal(self, phase: int, sub: Hashable) -> Literal:
        return self.parts.start if phase == OPEN else self.parts.end_rests[sub[0]]  # type: ignore[index]

    @staticmethod
    def _literal_state(sub: Hashable) -> int:
        return int(sub[1] if isinstance(sub, tuple) else sub)  # type: ignore[arg-type]

    def _with_markers(self, state: State, base: np.ndarray) -> np.ndarray:
        bits = base.copy()
        for token_id, text in self.markers.items():
            if self._walk(state, text, count=False) is not None:
                bits[token_id >> 3] |= np.uint8(1 << (token_id & 7))
        return bits

    def _all_bits(self) -> np.ndarray:
        if self._free_bits is None:
            mask = np.ones(self.vocab.size, bool)
            mask[list(self.vocab.end_ids)] = False
            self._free_bits = np.packbits(mask, bitorder="little")
        return self._free_bits
