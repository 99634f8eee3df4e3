"""DFA x vocabulary: for each DFA state, the tokens whose bytes it can read, walked vectorised.

Tokens are first reduced to sequences of the DFA's byte classes (tokens that read alike are walked
once), then every (state, sequence) pair whose first class is live is walked at once with numpy, a
column at a time, dropping pairs as they die. A state's mask is stored as a bitset (one
`unpackbits` per step); a token's end state is recomputed by walking its few bytes.

For lexers (grammar terminals) the walk also records *boundaries*: tokens that die part-way while
the bytes read so far form a complete lexeme; the grammar decides those per step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .automaton import Dfa
from .fsa import refine, row_ids
from .vocab import TokenVocab

_SHORT_TOKEN = 16  # tokens up to this many bytes are walked once per look-ahead class of states


@dataclass(slots=True)
class Walk:
    """Result of feeding rows' bytes (from `offset`) to a DFA from per-row start states."""

    end_state: np.ndarray  # state after the last byte, -1 if the walk died
    stop_pos: np.ndarray  # byte position that killed the walk (valid where end_state < 0)
    stop_state: np.ndarray  # state before that byte


def walk_rows(trans: np.ndarray, matrix: np.ndarray, lengths: np.ndarray, rows: np.ndarray,
              states: np.ndarray, offset: np.ndarray | int) -> Walk:
    """Vectorised DFA walk of `matrix[rows]` (symbols per row, `lengths` long), one column at a time."""
    n = len(rows)
    end = np.full(n, -1, np.int64)
    stop_pos = np.zeros(n, np.int64)
    stop_state = np.asarray(states, np.int64).copy()
    pos = np.broadcast_to(np.asarray(offset, np.int64), (n,)).copy()
    active = np.arange(n)
    cur = stop_state.copy()
    while active.size:
        r = rows[active]
        done = pos[active] >= lengths[r]
        end[active[done]] = cur[active[done]]
        active, r = active[~done], r[~done]
        if not active.size:
            break
        nxt = trans[cur[active], matrix[r, pos[active]]]
        dead = nxt < 0
        stop_pos[active[dead]] = pos[active[dead]]
        stop_state[active[dead]] = cur[active[dead]]
        active = active[~dead]
        cur[active] = nxt[~dead]
        pos[active] += 1
    return Walk(end, stop_pos, stop_state)


@dataclass(slots=True)
class _ClassView:
    """The vocabulary under the DFA's byte classes: tokens that read alike are walked once."""

    trans: np.ndarray  # [S, C] transitions by class
    matrix: np.ndarray  # [U, L] class sequences of the distinct tokens
    lengths: np.ndarray  # [U]
    of_row: np.ndarray  # [N] vocabulary row -> distinct sequence
    rows_by_seq: np.ndarray  # vocabulary rows ordered by their sequence
    seq_starts: np.ndarray  # [U + 1] where each sequence's rows start in rows_by_seq

    @classmethod
    def create(cls, dfa: Dfa, vocab: TokenVocab) -> "_ClassView":
        byte_class = row_ids(dfa.trans.T)
        first = np.unique(byte_class, return_index=True)[1]
        cols = np.arange(vocab.matrix.shape[1])
        seqs = np.where(cols < vocab.lengths[:, None], byte_class[vocab.matrix], len(first)).astype(np.int16)
        seqs = np.ascontiguousarray(seqs)
        _, pick, of_row = np.unique(seqs.view(np.dtype((np.void, seqs.shape[1] * 2))).ravel(),
                                    return_index=True, return_inverse=True)
        of_row = of_row.ravel()
        order = np.argsort(of_row, kind="stable")
        starts = np.searchsorted(of_row[order], np.arange(len(pick) + 1))
        return cls(np.ascontiguousarray(dfa.trans[:, first]), seqs[pick], vocab.lengths[pick], of_row, order, starts)


def _walk_from(view: _ClassView, dfa: Dfa, states: np.ndarray, seqs: np.ndarray) -> tuple[np.ndarray, ...]:
    """Walks every (state, sequence) pair whose first class is live; returns (state idx, seq, Walk)."""
    first = view.matrix[seqs, 0] if len(seqs) else np.zeros(0, np.int64)
    order = np.argsort(first, kind="stable")
    starts = np.searchsorted(first[order], np.arange(view.trans.shape[1] + 1))
    s_idx, cls_ = np.nonzero(view.trans[states] >= 0)
    counts = starts[cls_ + 1] - starts[cls_]
    pick = np.repeat(starts[cls_], counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    pair_states, pair_seqs = np.repeat(s_idx, counts), seqs[order[pick]]
    start = view.trans[states[pair_states], view.matrix[pair_seqs, 0]]
    return pair_states, pair_seqs, walk_rows(view.trans, view.matrix, view.lengths, pair_seqs, start, 1)


def _rows_of(view: _ClassView, seqs: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(index into seqs, vocabulary row) for every vocabulary row whose class sequence is in `seqs`."""
    lo, counts = view.seq_starts[seqs], view.seq_starts[seqs + 1] - view.seq_starts[seqs]
    within = np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts)
    return np.repeat(np.arange(len(seqs)), counts), view.rows_by_seq[np.repeat(lo, counts) + within]


class TokenIndex:
    """Per DFA state: the tokens it can read (a bitset) and, for lexers, its boundary records.

    Built on demand, one state at a time (a decode visits a small share of a big DFA's states), and
    kept. States that no string of <= `_SHORT_TOKEN` bytes tells apart share the walk of short tokens.
    """

    def __init__(self, dfa: Dfa, vocab: TokenVocab, boundaries: bool = False):
        self.dfa, self.vocab, self.with_boundaries = dfa, vocab, boundaries
        self.view = _ClassView.create(dfa, vocab)
        self.block = refine(self.view.trans, dfa.accept, _SHORT_TOKEN)
        self.short = np.flatnonzero(self.view.lengths <= _SHORT_TOKEN)
        self.long = np.flatnonzero(self.view.lengths > _SHORT_TOKEN)
        live = dfa.trans >= 0
        # the only byte that may follow (never in accepting states), else -1
        self.forced = np.where((live.sum(axis=1) == 1) & (dfa.accept < 0), live.argmax(axis=1), -1)
        self._blocks: dict[int, tuple[np.ndarray, tuple[np.ndarray, ...]]] = {}
        self._states: dict[int, tuple[np.ndarray, tuple[np.ndarray, ...]]] = {}

    def _entry(self, state: int) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        hit = self._states.get(state)
        if hit is None:
            b = int(self.block[state])
            if b not in self._blocks:
                self._blocks[b] = self._walk(state, self.short)
            short_bits, short_bounds = self._blocks[b]
            long_bits, long_bounds = self._walk(state, self.long)
            bounds = tuple(np.concatenate(cols) for cols in zip(short_bounds, long_bounds))
            hit = self._states[state] = (short_bits | long_bits, bounds)
        return hit

    def _walk(self, state: int, seqs: np.ndarray) -> tuple[np.ndarray, tuple[np.ndarray, ...]]:
        """Bits of the tokens (among `seqs`) readable from `state`, and its boundary records."""
        view, vocab, dfa = self.view, self.vocab, self.dfa
        _, pair_seqs, walk = _walk_from(view, dfa, np.array([state]), seqs)
        ok = walk.end_state >= 0
        mask = np.zeros(vocab.size, bool)
        mask[vocab.ids[_rows_of(view, pair_seqs[ok])[1]]] = True
        bounds: tuple[np.ndarray, ...] = (np.zeros(0, np.int64),) * 3
        if self.with_boundaries:
            hit = (~ok) & (dfa.accept[walk.stop_state] >= 0)
            pairs, rows = _rows_of(view, pair_seqs[hit])
            bounds = (rows, walk.stop_pos[hit][pairs], dfa.accept[walk.stop_state[hit]][pairs])
        return np.packbits(mask, bitorder="little"), bounds

    def mask(self, state: int) -> np.ndarray:
        """Bool [vocab.size]: tokens whose bytes all stay inside the DFA from `state`."""
        return np.unpackbits(self._entry(state)[0], count=self.vocab.size, bitorder="little").view(bool)

    def allows(self, state: int, token_id: int) -> bool:
        return bool(self._entry(state)[0][token_id >> 3] >> (token_id & 7) & 1)

    def boundaries(self, state: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(vocabulary rows, position, accepted label) of tokens that end a complete lexeme part-way."""
        assert self.with_boundaries, "boundaries were not requested for this index"
        return self._entry(state)[1]
