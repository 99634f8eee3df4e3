"""DFA x vocabulary: for each DFA state, the tokens whose bytes it can read. Built vectorised.

Every (state, token) pair is walked at once with numpy, a byte column at a time, keeping only the
pairs still alive; most die on the first byte, so the build costs about one gather per state and
token. Masks are stored as bitsets (a state's mask is one `unpackbits`), and a token's end state is
recomputed on demand by walking its few bytes, which keeps memory at S x V/8 bytes.

For lexers (grammar terminals) the build also records *boundaries*: tokens that die part-way while
the bytes read so far form a complete lexeme; the grammar decides those per step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from .automaton import Dfa
from .vocab import TokenVocab

_PAIRS_PER_BLOCK = 1 << 22  # bounds the temporary (state, token) arrays


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

    @classmethod
    def create(cls, dfa: Dfa, vocab: TokenVocab) -> "_ClassView":
        _, first, byte_class = np.unique(dfa.trans.T, axis=0, return_index=True, return_inverse=True)
        byte_class = byte_class.ravel()
        cols = np.arange(vocab.matrix.shape[1])
        seqs = np.where(cols < vocab.lengths[:, None], byte_class[vocab.matrix], len(first)).astype(np.int16)
        seqs = np.ascontiguousarray(seqs)
        _, pick, of_row = np.unique(seqs.view(np.dtype((np.void, seqs.shape[1] * 2))).ravel(),
                                    return_index=True, return_inverse=True)
        return cls(np.ascontiguousarray(dfa.trans[:, first]), seqs[pick], vocab.lengths[pick], of_row.ravel())


@dataclass(slots=True)
class TokenIndex:
    dfa: Dfa
    vocab: TokenVocab
    bits: np.ndarray  # [S, ceil(vocab.size / 8)] uint8: tokens readable from each state
    forced: np.ndarray  # [S] the only byte that may follow (never in accepting states), else -1
    # boundaries, sorted by state: rows of tokens that die at b_pos after a complete lexeme
    b_offsets: np.ndarray | None = None  # [S + 1]
    b_rows: np.ndarray | None = None
    b_pos: np.ndarray | None = None
    b_label: np.ndarray | None = None

    @classmethod
    def build(cls, dfa: Dfa, vocab: TokenVocab, boundaries: bool = False) -> "TokenIndex":
        view = _ClassView.create(dfa, vocab)
        S, n = dfa.num_states, len(view.lengths)
        bits = np.zeros((S, (vocab.size + 7) // 8), np.uint8)
        found: list[tuple[np.ndarray, ...]] = []
        block = max(1, _PAIRS_PER_BLOCK // max(n, 1))
        for lo in range(0, S, block):
            states = np.arange(lo, min(S, lo + block))
            first = view.trans[states][:, view.matrix[:, 0]]  # [B, U]
            s_idx, seqs = np.nonzero(first >= 0)
            walk = walk_rows(view.trans, view.matrix, view.lengths, seqs, first[s_idx, seqs], 1)
            ok = walk.end_state >= 0
            alive = np.zeros((len(states), n), bool)
            alive[s_idx[ok], seqs[ok]] = True
            mask = np.zeros((len(states), vocab.size), bool)
            mask[:, vocab.ids] = alive[:, view.of_row]
            bits[states] = np.packbits(mask, axis=1, bitorder="little")
            if boundaries:
                hit = (~ok) & (dfa.accept[walk.stop_state] >= 0)
                found.append(_expand(view.of_row, states[s_idx[hit]], seqs[hit], walk.stop_pos[hit],
                                     dfa.accept[walk.stop_state[hit]]))
        live = dfa.trans >= 0
        forced = np.where((live.sum(axis=1) == 1) & (dfa.accept < 0), live.argmax(axis=1), -1)
        index = cls(dfa, vocab, bits, forced)
        if boundaries:
            index._set_boundaries(found)
        return index

    def _set_boundaries(self, found: list[tuple[np.ndarray, ...]]) -> None:
        st, rows, pos, label = (np.concatenate(parts) for parts in zip(*found))
        order = np.lexsort((rows, st))
        self.b_rows, self.b_pos, self.b_label = rows[order], pos[order], label[order]
        self.b_offsets = np.searchsorted(st[order], np.arange(self.dfa.num_states + 1))

    def mask(self, state: int) -> np.ndarray:
        """Bool [vocab.size]: tokens whose bytes all stay inside the DFA from `state`."""
        return np.unpackbits(self.bits[state], count=self.vocab.size, bitorder="little").view(bool)

    def allows(self, state: int, token_id: int) -> bool:
        return bool(self.bits[state, token_id >> 3] >> (token_id & 7) & 1)

    def boundaries(self, state: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        lo, hi = self.b_offsets[state], self.b_offsets[state + 1]
        return self.b_rows[lo:hi], self.b_pos[lo:hi], self.b_label[lo:hi]


def _expand(of_row: np.ndarray, states: np.ndarray, seqs: np.ndarray, *extra: np.ndarray) -> tuple[np.ndarray, ...]:
    """(state, distinct sequence, ...) records -> (state, vocabulary row, ...) records."""
    order = np.argsort(of_row, kind="stable")
    starts = np.searchsorted(of_row[order], np.arange(of_row.max() + 2))
    counts = starts[seqs + 1] - starts[seqs]
    pick = np.repeat(starts[seqs], counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
    return (np.repeat(states, counts), order[pick], *(np.repeat(x, counts) for x in extra))
