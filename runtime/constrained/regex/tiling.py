"""Long bounded repeats x{m,n} as tiled copies of x's DFA, not an unrolled NFA to determinize.

Unrolled, `maxLength: 4096` is a 4096-step chain of the string character's automaton: ~30k NFA states
through the subset construction, ~0.3 s. When x is *prefix-free* (no match of x is a proper prefix of
another: a character, an escape) and its DFA's start has no incoming move, the DFA of x{m,n} is n
copies of x's DFA, each one's accepting state being the next one's start. So the regex is determinized
with each such repeat as one symbol of its own (a "tile symbol": the skeleton, small), and each of the
skeleton's tile moves s -> t is then replaced by the copies, stamped by numpy:

- copy 0's start is s itself (its row gains x's first moves);
- copy i's start (0 < i <= n; copy n is its start alone), once i >= max(m, 1), is also where the repeat may
  end: it gains t's row and label;
- t itself is kept only where something other than a tile move enters it.

This is exact only where those merged rows read disjoint symbols (then one character decides which of
the merged threads goes on, and the others die): `expand` checks that and returns None otherwise
(the caller unrolls instead).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True, slots=True)
class Tile:
    """One repeat x{m,n}: x's DFA rows without its accepting state, start first (`rows` [P, K]: a value
    v < P is state v, v == P the accepting state, -1 dead), and the bounds (min >= 1: a tile symbol
    reads at least one x; a repeat with m = 0 is the tile symbol or nothing)."""

    rows: np.ndarray
    min: int
    max: int


def item_rows(trans: np.ndarray, accept: np.ndarray, start: int) -> np.ndarray | None:
    """`Tile.rows` from x's trimmed, minimal DFA, or None where x is not prefix-free (an accepting state
    moves on, or several accept), accepts the empty string, or re-enters its start."""
    accepting = np.flatnonzero(accept >= 0)
    if len(accepting) != 1 or accepting[0] == start or (trans[accepting[0]] >= 0).any() or (trans == start).any():
        return None
    final = int(accepting[0])
    order = np.array([start] + [q for q in range(len(trans)) if q not in (start, final)], np.int64)
    local = np.full(len(trans) + 1, -1, np.int64)  # by old id (index -1: dead stays dead)
    local[order] = np.arange(len(order))
    local[final] = len(order)
    return local[trans[order]]


def expand(skeleton: np.ndarray, accept: np.ndarray, width: int,
           tiles: list[Tile]) -> tuple[np.ndarray, np.ndarray] | None:
    """The DFA over `width` symbols that `skeleton` ([S, width + len(tiles)]: column width + j is tile j's
    symbol) reads once each tile move is replaced by copies; its skeleton states keep their ids (so the
    start stays 0). A state's tiles of one item (the same `rows`: a lexer's `x{0,512}"` beside `x{512}`)
    share one chain of copies, where each copy's start joins the ends of those that may end there. None
    where merged rows would read a symbol twice, or merged ends accept different labels."""
    rows = skeleton[:, :width].astype(np.int64)
    chains: list[tuple[int, np.ndarray, list[tuple[int, int, int]]]] = []  # (s, item rows, [(t, min, max)])
    for s in np.flatnonzero((skeleton[:, width:] >= 0).any(axis=1)).tolist():
        by_item: dict[int, tuple[np.ndarray, list[tuple[int, int, int]]]] = {}
        for j in np.flatnonzero(skeleton[s, width:] >= 0).tolist():
            tile = tiles[j]
            by_item.setdefault(id(tile.rows), (tile.rows, []))[1].append((int(skeleton[s, width + j]), tile.min, tile.max))
        chains += [(s, inner, ends) for inner, ends in by_item.values()]
    blocks, placed = [], []  # the copies' rows after the skeleton's; (id of flat row 0, copy size, copies, ends)
    next_id = len(skeleton)
    for s, inner, ends in chains:
        size, count = len(inner), max(hi for _, _, hi in ends)
        base = next_id - 1  # flat row r of the chain is state base + r; its row 0 is copy 0's start: s
        copy = np.arange(count)[:, None, None]
        block = np.where(inner < 0, -1, base + np.where(inner == size, copy + 1, copy) * size
                         + np.where(inner == size, 0, inner)).reshape(-1, width)
        if ((rows[s] >= 0) & (block[0] >= 0)).any():
            return None
        rows[s] = np.where(block[0] >= 0, block[0], rows[s])
        blocks += [block[1:], np.full((1, width), -1, np.int64)]  # then the start of copy `count`: ends only
        placed.append((base, size, count, ends))
        next_id += count * size
    trans = np.concatenate([rows, *blocks])
    labels = np.concatenate([accept, np.full(len(trans) - len(accept), -1, accept.dtype)])
    for base, size, count, ends in placed:  # copy i's start joins the ends t with min <= i <= max
        cuts = sorted({1, count + 1} | {lo for _, lo, _ in ends} | {hi + 1 for _, _, hi in ends})
        for a, b in zip(cuts, cuts[1:]):
            joined = [t for t, lo, hi in ends if lo <= a <= hi]
            if not joined:
                continue
            row = rows[joined[0]]
            for t in joined[1:]:
                if ((row >= 0) & (rows[t] >= 0)).any():
                    return None
                row = np.where(rows[t] >= 0, rows[t], row)
            hits = {int(accept[t]) for t in joined} - {-1}
            if len(hits) > 1:
                return None
            at = base + np.arange(a, b) * size
            if ((trans[at] >= 0) & (row >= 0)).any():
                return None
            trans[at] = np.where(row >= 0, row, trans[at])
            labels[at] = hits.pop() if hits else -1
    entered, read = _reached(skeleton[:, :width], chains)
    keep = np.zeros(len(trans), bool)
    keep[entered] = True
    for (s, _, _), (base, size, count, _) in zip(chains, placed):
        keep[base + 1:base + count * size + 1] = s in read  # its rows are read where s's row is
    new_id = np.cumsum(keep) - 1
    return np.where(trans >= 0, new_id[np.maximum(trans, 0)], -1)[keep], labels[keep]


def _reached(real: np.ndarray,
             chains: list[tuple[int, np.ndarray, list[tuple[int, int, int]]]]) -> tuple[list[int], set[int]]:
    """The skeleton states still entered once tiles are replaced, and those whose rows are still read. A
    tile's end t is no longer entered (the copies' starts take its row), so t is kept only where a real
    move or the start leads to it."""
    ends_from: dict[int, list[int]] = {}
    for s, _, ends in chains:
        ends_from.setdefault(s, []).extend(t for t, _, _ in ends)
    reached, left = {0}, set()  # states entered; states whose row was read (entered, or joined at an end)
    stack = [0]
    while stack:
        u = stack.pop()
        if u in left:
            continue
        left.add(u)
        for v in real[u][real[u] >= 0].tolist():
            reached.add(v)
            stack.append(v)
        stack += ends_from.get(u, [])
    return sorted(reached), left
