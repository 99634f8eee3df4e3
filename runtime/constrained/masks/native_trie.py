"""The vocabulary trie as flat arrays by node number, walked by the native token walk (kernels/cpu/token_walk.c).

Built once per vocabulary (beside VocabTrie, which it flattens). Per DFA, `NativeWalker` holds the automaton's
tables as the C code reads them and walks one state at a time; the masks equal the numpy walk's
(token_index.TokenIndex), which stays the path where no C compiler is found.
"""
from __future__ import annotations

import ctypes
import threading
from dataclasses import dataclass, field

import numpy as np

from ....kernels.cpu.token_walk import library
from ..regex.automaton import Dfa
from .vocab_trie import VocabTrie

LOOP_MIN_BYTES = 32  # a start state looping on fewer bytes walks its loop: skipping saves little there
_WITHIN_CACHE = 64  # loop sets whose tokens are kept (a schema's strings share a few)


@dataclass(eq=False)
class NativeTrie:
    lib: ctypes.CDLL
    size: int  # mask length in tokens
    root_children: int
    child_lo: np.ndarray  # [n] int64: a node's children are node numbers [child_lo, child_hi)
    child_hi: np.ndarray
    byte: np.ndarray  # [n] uint8
    end_start: np.ndarray  # [n + 1] int64: the ids of the tokens ending at node k: end_ids[end_start[k]:end_start[k+1]]
    end_ids: np.ndarray
    path: np.ndarray  # [n * 4] uint64: the bytes on a node's path, a 256-bit set per node
    subtree: np.ndarray  # [n * 4] uint64: the bytes in a node's subtree
    row_start: np.ndarray  # [n] int64: a node's subtree as sorted rows (VocabTrie.sorted_rows)
    row_end: np.ndarray
    token_node: np.ndarray  # [N] by vocabulary row
    ids: np.ndarray  # [N] token id by row
    _within: dict[bytes, np.ndarray] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def create(cls, trie: VocabTrie, ids: np.ndarray, size: int) -> "NativeTrie | None":
        """None where the native library is not available."""
        lib = library()
        if lib is None:
            return None
        levels = trie.levels
        n = trie.num_nodes
        child_lo = np.zeros(n, np.int64)
        child_hi = np.zeros(n, np.int64)
        parent = np.full(n, -1, np.int64)
        for i, level in enumerate(levels):
            span = slice(level.offset, level.offset + len(level.byte))
            if i + 1 < len(levels):
                below = levels[i + 1].offset
                child_lo[span] = below + level.child_start[:-1]
                child_hi[span] = below + level.child_start[1:]
            if i:
                parent[span] = level.parent + levels[i - 1].offset
        byte = np.concatenate([level.byte for level in levels]).astype(np.uint8)
        order = np.argsort(trie.token_node, kind="stable")
        end_start = np.searchsorted(trie.token_node[order], np.arange(n + 1)).astype(np.int64)
        path = np.zeros(n * 4, np.uint64)
        subtree = np.zeros(n * 4, np.uint64)
        lib.rl_trie_bytes(n, parent, byte, path, subtree)
        return cls(lib, size, trie.root_children, child_lo, child_hi, byte, end_start,
                   np.ascontiguousarray(ids[order], np.int64), path, subtree,
                   np.concatenate([level.row_start for level in levels]).astype(np.int64),
                   np.concatenate([level.row_end for level in levels]).astype(np.int64),
                   np.ascontiguousarray(trie.token_node, np.int64), np.ascontiguousarray(ids, np.int64))

    def within(self, loop: np.ndarray) -> np.ndarray:
        """Packed bits of the tokens made only of the bytes in `loop` (a 256-bit set as 4 uint64); shared."""
        key = loop.tobytes()
        hit = self._within.get(key)
        if hit is None:
            hit = np.zeros(-(-self.size // 8), np.uint8)
            self.lib.rl_tokens_within(len(self.ids), self.token_node, self.ids, self.path, loop, hit)
            hit.flags.writeable = False
            with self._lock:
                if len(self._within) >= _WITHIN_CACHE:
                    self._within.pop(next(iter(self._within)))
                self._within[key] = hit
        return hit


@dataclass(slots=True)
class NativeResult:
    bits: np.ndarray  # packed little-endian mask bits
    bound_nodes: np.ndarray  # trie nodes that died after a complete lexeme (with boundaries)
    bound_pos: np.ndarray
    bound_labels: np.ndarray
    unbuilt: np.ndarray  # unbuilt states reached (the walk is then void)


class NativeWalker:
    """One DFA's tables as token_walk.c reads them."""

    def __init__(self, trie: NativeTrie, dfa: Dfa, unbuilt: np.ndarray | None):
        self.trie = trie
        self.trans = np.ascontiguousarray(dfa.trans, np.int32)
        self.width = int(dfa.trans.shape[1])
        self.byte_class = np.ascontiguousarray(dfa.byte_class, np.int32)
        self.accept = np.ascontiguousarray(dfa.accept, np.int32)
        self.unbuilt = None if unbuilt is None else np.ascontiguousarray(unbuilt).view(np.uint8)  # a view: marks may clear
        self._bounds = 1024  # boundary room; grows when a walk finds more

    def walk(self, state: int, boundaries: bool) -> NativeResult:
        t = self.trie
        loops = self.trans[state][self.byte_class] == state
        loop = None
        bits = np.zeros(-(-t.size // 8), np.uint8)
        if loops.sum() >= LOOP_MIN_BYTES:
            loop = np.packbits(loops, bitorder="little").view("<u8").astype(np.uint64)
            bits[:] = t.within(loop)
        unbuilt_hits = np.zeros(64, np.int64)
        count = np.zeros(1, np.int64)
        while True:
            cap = self._bounds if boundaries else -1
            nodes, pos, labels = (np.zeros(max(cap, 0), np.int64) for _ in range(3))
            found = t.lib.rl_walk(
                t.root_children, t.child_lo, t.child_hi, t.byte, t.end_start, t.end_ids, t.subtree,
                self.trans, self.width, self.byte_class, self.accept,
                None if self.unbuilt is None else self.unbuilt.ctypes.data, state,
                None if loop is None else loop.ctypes.data, bits, cap, nodes, pos, labels,
                unbuilt_hits, len(unbuilt_hits), count)
            if found < 0:
                raise RecursionError("the vocabulary trie is deeper than the native walk's stack")
            if found <= max(cap, 0):
                break
            self._bounds = int(found)  # again with room for them (the bits come out the same)
        hits = unbuilt_hits[:min(int(count[0]), len(unbuilt_hits))]
        return NativeResult(bits, nodes[:found], pos[:found], labels[:found], np.unique(hits))
