"""DFA x vocabulary: for each DFA state, the tokens whose bytes it can read, walked vectorised.

A state's tokens come from one walk of the vocabulary trie (vocab_trie), a level at a time, only
below live nodes; the mask is stored as a bitset. A token's end state is recomputed by walking its
few bytes. `walk_rows` walks given rows column by column (the grammar's suffix walks).

For lexers (grammar terminals) the walk also records *boundaries*: tokens that die part-way while
the bytes read so far form a complete lexeme; the grammar decides those per step.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import xxhash

from ..regex.automaton import Dfa
from .native_trie import NativeTrie, NativeWalker
from .vocab import TokenVocab
from .vocab_trie import TrieLevel, VocabTrie
from .vocab_trie import expand_ranges as _expand


@dataclass(slots=True)
class Walk:
    """Result of feeding rows' bytes (from `offset`) to a DFA from per-row start states."""

    end_state: np.ndarray  # state after the last byte, -1 if the walk died
    stop_pos: np.ndarray  # byte position that killed the walk (valid where end_state < 0)
    stop_state: np.ndarray  # state before that byte


def walk_rows(dfa: Dfa, matrix: np.ndarray, lengths: np.ndarray, rows: np.ndarray,
              states: np.ndarray, offset: np.ndarray | int) -> Walk:
    """Vectorised DFA walk of `matrix[rows]` (bytes per row, `lengths` long), one column at a time."""
    trans, byte_class = dfa.trans, dfa.byte_class
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
        nxt = trans[cur[active], byte_class[matrix[r, pos[active]]]]
        dead = nxt < 0
        stop_pos[active[dead]] = pos[active[dead]]
        stop_state[active[dead]] = cur[active[dead]]
        active = active[~dead]
        cur[active] = nxt[~dead]
        pos[active] += 1
    return Walk(end, stop_pos, stop_state)


SHARE_WALKS = True  # states of any DFA that read alike (native_trie's signature) share one walk
_EMPTY = np.zeros(0, np.int64)
_EMPTY.flags.writeable = False


class Unbuilt(Exception):
    """A walk reached states whose rows are not built yet (a lazily built DFA fills them, then asks again)."""

    def __init__(self, states: np.ndarray):
        super().__init__(f"states {states.tolist()} are not built yet")
        self.states = states


class TokenIndex:
    """Per DFA state: the tokens it can read (a bitset) and, for lexers, its boundary records.

    Built on demand, one state at a time (a decode visits a small share of a big DFA's states), by one
    walk of the vocabulary trie from the state, and kept. `unbuilt` (bool per state, may change) marks
    rows a lazily built DFA has not filled in: a walk that reaches one raises `Unbuilt` and keeps nothing.
    """

    def __init__(self, dfa: Dfa, vocab: TokenVocab, boundaries: bool = False, unbuilt: np.ndarray | None = None):
        self.dfa, self.vocab, self.with_boundaries, self.unbuilt = dfa, vocab, boundaries, unbuilt
        self._states: dict[int, tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]] = {}
        # each distinct mask once, by its hash: a schema's states share a tenth as many masks (a key's letters, a
        # string's inside), and a compile's warming (warming.py) keeps hundreds of states' masks
        self._distinct: dict[int, np.ndarray] = {}
        self._forced: dict[int, int] = {}  # forced_byte's, for built rows
        self._native: NativeWalker | None = None

    def grown(self, dfa: Dfa, unbuilt: np.ndarray) -> "TokenIndex":
        """The index of `dfa`, this index's DFA with unbuilt rows filled in and rows added: every mask
        kept so far stays true (its walk reached no unbuilt row, and built rows never change), and so
        do the forced bytes found so far (of built rows only)."""
        out = TokenIndex(dfa, self.vocab, self.with_boundaries, unbuilt)
        out._states, out._distinct, out._forced = self._states, self._distinct, self._forced
        if self._native is not None:
            out._native = NativeWalker(self._native.trie, dfa, unbuilt, grown_from=self._native)
        return out

    def forced_byte(self, state: int) -> int:
        """The only byte that may follow `state` (never an accepting one), else -1 (and -1 for an unbuilt row,
        which reads nothing yet); found on first ask: jump-forward asks about few states."""
        hit = self._forced.get(state)
        if hit is None:
            if self.unbuilt is not None and self.unbuilt[state]:
                return -1
            live = np.flatnonzero(self.dfa.row(state) >= 0)
            hit = self._forced[state] = int(live[0]) if len(live) == 1 and self.dfa.accept[state] < 0 else -1
        return hit

    def holds(self, state: int) -> bool:
        """Whether `state`'s walk is kept (its mask costs a lookup)."""
        return state in self._states

    def _entry(self, state: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        hit = self._states.get(state)
        if hit is None:
            bits, bounds = self._walk(state)
            bits.flags.writeable = False  # shared (and read-only rows are Matcher.mask_words' own)
            key = xxhash.xxh3_64_intdigest(bits.data)
            same = self._distinct.setdefault(key, bits)
            hit = self._states[state] = (same if same is bits or same.tobytes() == bits.tobytes() else bits, bounds)
        return hit

    def _walk(self, state: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Bits of the tokens readable from `state`, and its boundary records: natively where the C walk
        is available (microseconds), else with numpy."""
        native = self.vocab.native_trie
        if native is None:
            return self._walk_numpy(state)
        walker = self._walker(native)
        # a lazily built table's states reach most of its (growing) object: they almost never read alike
        signature = walker.signature(state, self.with_boundaries) if SHARE_WALKS and self.unbuilt is None else None
        if signature is not None:
            hit = native.shared_walk(signature)
            if hit is not None:
                return hit
        walked = walker.walk(state, self.with_boundaries)
        if len(walked.unbuilt):
            raise Unbuilt(walked.unbuilt)
        out = (_EMPTY, _EMPTY, _EMPTY)
        if self.with_boundaries and len(walked.bound_rows):
            out = (walked.bound_rows, walked.bound_pos, walked.bound_labels)
        entry = (walked.bits, out)
        if signature is not None:
            for a in (walked.bits, *out):
                a.flags.writeable = False
            native.keep_walk(signature, entry, walked.bits.nbytes + sum(a.nbytes for a in out))
        return entry

    def _walk_numpy(self, state: int) -> tuple[np.ndarray, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """`_walk` in numpy: the trie's live nodes, a level at a time, expanding only the children of live nodes."""
        trie, vocab, accept = self.vocab.trie, self.vocab, self.dfa.accept
        flat, byte_class, width = self.dfa.trans.ravel(), self.dfa.byte_class, self.dfa.trans.shape[1]
        alive = np.zeros(trie.num_nodes, bool)  # by trie node: the DFA lives through its prefix
        bounds: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        nodes = np.arange(trie.root_children)
        from_states = np.full(len(nodes), state * width, np.int64)
        for depth, level in enumerate(trie.levels, 1):
            states = flat[from_states + byte_class[level.byte[nodes]]]
            live = states >= 0
            if self.with_boundaries and depth > 1 and not live.all():
                labels = accept[from_states // width]
                ended = ~live & (labels >= 0)
                if ended.any():
                    bounds.append(_ended_rows(trie, level, nodes[ended], labels[ended], depth - 1))
            nodes, states = nodes[live], states[live]
            if self.unbuilt is not None and self.unbuilt[states].any():
                raise Unbuilt(np.unique(states[self.unbuilt[states]]))
            if not len(nodes):
                break
            alive[level.offset + nodes] = True
            lo = level.child_start[nodes]
            counts = level.child_start[nodes + 1] - lo
            nodes = _expand(lo, counts)
            from_states = np.repeat(states.astype(np.int64) * width, counts)
        mask = np.zeros(vocab.size, bool)
        mask[vocab.ids] = alive[trie.token_node]
        empty = np.zeros(0, np.int64)
        out = (empty, empty, empty)
        if bounds:
            token_rows, positions, accepted = zip(*bounds)
            out = (np.concatenate(token_rows), np.concatenate(positions), np.concatenate(accepted))
        return np.packbits(mask, bitorder="little"), out

    def walk_rows(self, rows: np.ndarray, start: int, offset: int | np.ndarray) -> Walk:
        """`walk_rows` of vocabulary rows from `offset` (one for all, or per row), each from DFA state `start`
        (natively where it can)."""
        vocab = self.vocab
        if vocab.native_trie is None:
            return walk_rows(self.dfa, vocab.matrix, vocab.lengths, rows, np.full(len(rows), start), offset)
        return Walk(*self._walker(vocab.native_trie).walk_rows(vocab.matrix, vocab.lengths, rows, start, offset))

    def _walker(self, native: NativeTrie) -> NativeWalker:
        if self._native is None:
            self._native = NativeWalker(native, self.dfa, self.unbuilt)
        return self._native

    def mask(self, state: int) -> np.ndarray:
        """Bool [vocab.size]: tokens whose bytes all stay inside the DFA from `state`."""
        return np.unpackbits(self._entry(state)[0], count=self.vocab.size, bitorder="little").view(bool)

    def packed(self, state: int) -> np.ndarray:
        """`mask` as little-endian bits (uint8, bit i of byte k allowing token 8k + i); shared, read-only."""
        return self._entry(state)[0]

    def allows(self, state: int, token_id: int) -> bool:
        return bool(self._entry(state)[0][token_id >> 3] >> (token_id & 7) & 1)

    def boundaries(self, state: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(vocabulary rows, position, accepted label) of tokens that end a complete lexeme part-way."""
        assert self.with_boundaries, "boundaries were not requested for this index"
        return self._entry(state)[1]


def _ended_rows(trie: VocabTrie, level: TrieLevel, nodes: np.ndarray, labels: np.ndarray,
                pos: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(rows, pos, label) for every token below `nodes` (each dead after a complete lexeme of `pos` bytes)."""
    counts = level.row_end[nodes] - level.row_start[nodes]
    rows = trie.sorted_rows[_expand(level.row_start[nodes], counts)]
    return rows, np.full(len(rows), pos, np.int64), np.repeat(labels, counts).astype(np.int64)
