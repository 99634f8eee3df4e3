"""The vocabulary as a byte trie, laid out level by level for vectorised walks (built once per vocabulary).

Token rows sorted by their bytes put every prefix's tokens next to each other, so a node (a distinct
prefix) owns a contiguous range of sorted rows, and the nodes of one level are ordered by parent: a
node's children are a contiguous range of the next level. A DFA walk then costs one gather per live
trie node, whatever the DFA (no per-DFA preprocessing of the vocabulary).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(slots=True)
class TrieLevel:
    """The nodes at one depth d >= 1 (prefixes of d bytes), ordered by parent then byte."""

    byte: np.ndarray  # [n] the node's last byte
    parent: np.ndarray  # [n] index of the parent in the level above
    child_start: np.ndarray  # [n + 1] the node's children in the level below: [start[k], start[k + 1])
    row_start: np.ndarray  # [n] sorted rows of the node's subtree: [row_start, row_end)
    row_end: np.ndarray  # [n]
    offset: int  # the first node's number in the whole trie (levels numbered one after another)


@dataclass(slots=True)
class VocabTrie:
    levels: list[TrieLevel]  # levels[d - 1] holds the nodes at depth d
    sorted_rows: np.ndarray  # vocabulary rows in byte order (subtree ranges index this)
    root_children: int  # nodes at depth 1 (all children of the root)
    num_nodes: int
    token_node: np.ndarray  # [N] the node (trie number) where each vocabulary row's bytes end

    @classmethod
    def create(cls, matrix: np.ndarray, lengths: np.ndarray) -> "VocabTrie":
        width = matrix.shape[1]
        cols = np.arange(width)
        keyed = np.where(cols < lengths[:, None], matrix.astype(np.int16) + 1, 0)  # shorter prefixes sort first
        order = np.lexsort(keyed.T[::-1])
        keyed, lens = keyed[order], lengths[order]
        same = np.cumprod(keyed[1:] == keyed[:-1], axis=1).sum(axis=1)
        lcp = np.concatenate([[0], np.minimum(same, np.minimum(lens[1:], lens[:-1]))])
        n = len(order)
        levels: list[TrieLevel] = []
        node_of_row = np.zeros(n, np.int64)  # the row's node at the previous depth (the root: 0)
        token_node = np.zeros(n, np.int64)
        offset = 0
        for d in range(1, int(lens.max()) + 1):
            has = lens >= d
            new = has & (lcp < d)
            reps = np.flatnonzero(new)
            ids = np.cumsum(new) - 1  # a row's node at depth d (valid where has)
            starts = np.flatnonzero(lcp < d)  # rows where a depth-d prefix (or a shorter token) begins
            ends = np.append(starts, n)[np.searchsorted(starts, reps, side="right")]
            parent = node_of_row[reps]
            ending = np.flatnonzero(lens == d)
            token_node[order[ending]] = offset + ids[ending]
            levels.append(TrieLevel(matrix[order[reps], d - 1].astype(np.int64), parent, np.zeros(0, np.int64),
                                    reps, ends, offset))
            offset += len(reps)
            node_of_row = np.where(has, ids, 0)
        for above, below in zip(levels, levels[1:]):
            above.child_start = np.searchsorted(below.parent, np.arange(len(above.byte) + 1))
        levels[-1].child_start = np.zeros(len(levels[-1].byte) + 1, np.int64)
        return cls(levels, order, len(levels[0].byte), offset, token_node)


def expand_ranges(starts: np.ndarray, counts: np.ndarray) -> np.ndarray:
    """The concatenated ranges [start, start + count)."""
    return np.repeat(starts - np.cumsum(counts) + counts, counts) + np.arange(int(counts.sum()))
