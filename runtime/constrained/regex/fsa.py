"""Finite automata over abstract symbols 0..K-1: Thompson NFA, subset construction, trimming, minimization.

Regexes are built over code-point classes; the token index refines byte-level DFAs over byte classes.
A DFA here is a pair (trans [S, K] with -1 = dead, accept [S] = label or -1) whose start is state 0.
"""
from __future__ import annotations

import functools
import itertools
import operator
from dataclasses import dataclass
from typing import Callable, Hashable, Iterable, Protocol, Sequence, TypeVar

import numpy as np

from ...config import MAX_DFA_STATES, MAX_NFA_STATES
from .. import deadline
from . import native_fsa


class ConstraintTooLarge(ValueError):
    """An automaton over its size bound. At compile time the request is refused (400); lexers are built on
    first use, so mid-decode it ends only the request whose constraint it is."""


K = TypeVar("K", bound=Hashable)


def too_large(limit: int) -> ConstraintTooLarge:
    return ConstraintTooLarge(f"constraint is too large: its DFA exceeds {limit} states")


class Nfa:
    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[Sequence[int], int]]] = []  # (symbols, target)
        self.accepts: dict[int, int] = {}

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise ConstraintTooLarge(f"constraint is too large: its automaton exceeds {MAX_NFA_STATES} NFA states")
        if not len(self.eps) & 1023:
            deadline.check()
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def new_many(self, count: int) -> int:
        """`count` new states numbered from the one returned, as `count` calls of `new` number them."""
        first = len(self.eps)
        if first + count > MAX_NFA_STATES:
            raise ConstraintTooLarge(f"constraint is too large: its automaton exceeds {MAX_NFA_STATES} NFA states")
        if (first - 1) >> 10 != (first + count - 1) >> 10:  # `new` checks at every 1024th state
            deadline.check()
        self.eps.extend([] for _ in range(count))
        self.edges.extend([] for _ in range(count))
        return first


class Moves(Protocol[K]):
    """Each node's successors: an NFA's `eps` (its empty moves), a walker's own view of them, a graph's
    adjacency lists."""

    def __getitem__(self, q: K, /) -> Iterable[K]: ...


def reach(moves: Moves[K], starts: Iterable[K]) -> set[K]:
    """The nodes `starts` reach over `moves` (the starts included)."""
    seen = set(starts)
    stack = list(seen)
    while stack:
        for t in moves[stack.pop()]:
            if t not in seen:
                seen.add(t)
                stack.append(t)
    return seen


def determinize(nfa: Nfa, start: int, num_symbols: int, drop_start_accept: bool = False,
                readings: list[tuple[int, ...]] | None = None,
                limit: int | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Subset construction, then trimming and minimization. A state accepting several labels keeps
    the lowest; `drop_start_accept` makes the start state non-accepting (nothing may lead back to it).
    Given `readings` (an empty list), a state's label instead numbers the tuple of all the labels it
    accepts, appended there (a grammar's lexer that reads each terminal a lexeme matches). Over `limit`
    states (MAX_DFA_STATES if None) it raises ConstraintTooLarge."""
    trans, sets = subsets(nfa, start, num_symbols, limit)
    states, labels = sets.accepted(nfa.accepts)
    accept = np.full(len(trans), -1, np.int64)
    firsts = np.flatnonzero(np.diff(states, prepend=-1))  # each accepting state's lowest label, then the rest
    if readings is None:
        accept[states[firsts]] = labels[firsts]
    else:
        ids: dict[tuple[int, ...], int] = {}
        bounds = [*firsts.tolist(), len(states)]
        accept[states[firsts]] = [ids.setdefault(tuple(labels[lo:hi].tolist()), len(ids))
                                  for lo, hi in itertools.pairwise(bounds)]
        readings.extend(ids)
    if drop_start_accept:
        accept[0] = -1
    return minimize(*trim(trans, accept))


@dataclass(frozen=True, slots=True)
class Subsets:
    """Each DFA state's subset of the subset construction (see `subsets`): members[ptr[s]:ptr[s + 1]], sorted."""
    ptr: np.ndarray  # [S + 1]
    members: np.ndarray

    def accepted(self, accepts: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
        """(states, labels): every label a DFA state accepts (`accepts`: an NFA state's label), each once, by
        state then label."""
        if not accepts or not len(self.members):
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        keys = np.fromiter(accepts, np.int64, len(accepts))
        label_of = np.full(max(int(keys.max()), int(self.members.max())) + 1, -1, np.int64)
        label_of[keys] = np.fromiter(accepts.values(), np.int64, len(accepts))
        labels = label_of[self.members]
        states = np.repeat(np.arange(len(self.ptr) - 1), np.diff(self.ptr))
        hit = labels >= 0
        width = int(labels.max()) + 1
        pairs = np.unique(states[hit] * width + labels[hit])  # by state, then label
        return pairs // width, pairs % width


def subsets(nfa: Nfa, start: int, num_symbols: int, limit: int | None = None) -> tuple[np.ndarray, Subsets]:
    """The subset construction alone: the DFA's rows [S, num_symbols] (-1: dead; state 0 is the start)
    and each state's subset. Over `limit` states (MAX_DFA_STATES if None) it raises ConstraintTooLarge.

    Subsets are sets of the NFA states that read or accept, and the start (the rest only pass on, so
    subsets that differ in those alone are one state). States are numbered as first met: row by row, each
    row from symbol 0 up, so the native construction (native_fsa, kernels/cpu/fsa.c) numbers them
    alike; it is taken where it is built, else `_subsets` (the same DFA)."""
    bound = MAX_DFA_STATES if limit is None else limit
    if native_fsa.available():
        status, trans, ptr, members = native_fsa.subsets(nfa, start, num_symbols, bound)
        if status == native_fsa.native.TOO_LARGE:
            raise too_large(bound)
        if status == native_fsa.native.DEADLINE:
            deadline.check()
            raise deadline.CompileDeadline("the deadline passed")
        if status != native_fsa.native.OK:
            raise MemoryError("the subset construction ran out of memory")
        return trans, Subsets(ptr, members)
    trans, order = _subsets(nfa, start, num_symbols, limit)
    ptr = np.zeros(len(order) + 1, np.int64)
    np.cumsum([len(d) for d in order], out=ptr[1:])
    return trans, Subsets(ptr, np.fromiter(itertools.chain.from_iterable(map(sorted, order)), np.int64, int(ptr[-1])))


def _subsets(nfa: Nfa, start: int, num_symbols: int,
             limit: int | None = None) -> tuple[np.ndarray, list[frozenset[int]]]:
    """`subsets` in Python: the rows and each state's subset.

    Subsets are frozensets; their hashes are cached, and their size tracks the
    subset, not the NFA (a bitset of a 100k-state NFA costs 12 KiB to hash). A state's edges are
    grouped by symbol set first, and the sets refined into the disjoint parts that read alike (`_Layout`,
    built once per list of symbol sets, as many states read alike): each part costs one union and one
    lookup, not one per symbol (a class set such as `[^"\\]` covers many classes, and where sets
    overlap, `\\w+` beside `\\d{4}`, Unicode classes have hundreds), and the row is one gather."""
    important = {q for q, edges in enumerate(nfa.edges) if edges} | set(nfa.accepts)
    important.add(start)  # keeps the start apart from any subset that reads the same way (see above)
    closures: dict[int, frozenset[int]] = {}

    def closure(q: int) -> frozenset[int]:
        hit = closures.get(q)
        if hit is None:
            if not nfa.eps[q]:  # most targets (a chain of reads): no walk, no intersection
                hit = closures[q] = frozenset((q,)) if q in important else frozenset()
                return hit
            hit = closures[q] = frozenset(reach(nfa.eps, (q,)) & important)
        return hit

    moves_of: dict[int, list[tuple[int, Sequence[int], frozenset[int]]]] = {}  # state -> (key, symbols, closure)
    layouts: dict[tuple[int, ...], _Layout] = {}  # by the groups' symbol tuples (ids), in order
    first = closure(start)
    ids, order, done = {first: 0}, [first], 0
    rows: list[int] = []  # the DFA's rows, flat
    while done < len(order):
        groups: dict[int, tuple[Sequence[int], frozenset[int]]] = {}  # by symbol tuple (shared per class set)
        for q in order[done]:
            moves = moves_of.get(q)
            if moves is None:
                moves = moves_of[q] = [(id(symbols), symbols, closure(t)) for symbols, t in nfa.edges[q]]
            for key, symbols, target in moves:
                held = groups.get(key)
                groups[key] = (symbols, target) if held is None else (symbols, held[1] | target)
        layout = layouts.get(keys := tuple(groups))
        if layout is None:
            layout = layouts[keys] = _Layout([symbols for symbols, _ in groups.values()], num_symbols)
        targets = [t for _, t in groups.values()]
        states = [state_id(ids, order, targets[which[0]] if len(which) == 1
                           else targets[which[0]].union(*[targets[i] for i in which[1:]]), limit)
                  for which in layout.parts]
        states.append(-1)  # the part of the symbols no group reads: dead
        rows.extend(layout.pick(states))
        done += 1
    return np.array(rows, np.int64).reshape(len(order), num_symbols), order


class _Layout:
    """How a DFA state's row is made from its groups of moves (one per symbol tuple, in order): the groups'
    symbol sets refined into disjoint parts (a part's symbols are read by the same groups, so go to the
    union of their targets), and each symbol's part. States whose groups read the same symbol tuples
    share one (it is built once per such list, not per state)."""

    def __init__(self, symbol_sets: list[Sequence[int]], num_symbols: int):
        parts: list[tuple[frozenset[int], tuple[int, ...]]] = []  # (symbols, the groups reading them)
        for g, symbols in enumerate(symbol_sets):
            rest = frozenset(symbols)
            refined = []
            for part, which in parts:
                both = part & rest
                if not both:
                    refined.append((part, which))
                    continue
                refined.append((both, (*which, g)))
                if len(both) < len(part):
                    refined.append((part - both, which))
                rest -= both
            if rest:
                refined.append((rest, (g,)))
            parts = refined
        parts.sort(key=lambda part: min(part[0]))  # looked up in the order of their first symbols (`subsets`)
        self.parts = [which for _, which in parts]
        part_of = [-1] * num_symbols  # -1: the last state given to pick, dead
        for p, (symbols_of_part, _) in enumerate(parts):
            for c in symbols_of_part:
                part_of[c] = p
        # the row from the parts' states, in C (itemgetter of one index returns an item, not a tuple)
        self.pick: Callable[[list[int]], Sequence[int]] = (
            operator.itemgetter(*part_of) if num_symbols > 1 else lambda states: [states[i] for i in part_of])


def state_id(ids: dict[K, int], order: list[K], key: K, limit: int | None = None) -> int:
    """The id of the DFA state `key` of a construction (subsets, products); new keys join `order`,
    up to `limit` states (MAX_DFA_STATES if None)."""
    hit = ids.get(key)
    if hit is None:
        if len(order) >= (MAX_DFA_STATES if limit is None else limit):
            raise too_large(MAX_DFA_STATES if limit is None else limit)
        if not len(order) & 255:
            deadline.check()
        hit = ids[key] = len(order)
        order.append(key)
    return hit


def trim(trans: np.ndarray, accept: np.ndarray, narrow: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Removes states that cannot reach acceptance (start is kept as state 0 even if dead). `narrow`: the same
    DFA over its byte classes, where the live states are found in a fraction of the time (a lazily built
    object's hub, trimmed at every member written, has 256 columns and ~20 classes). The rows keep their dtype."""
    over = trans if narrow is None else narrow
    live = native_fsa.live(over, accept) if native_fsa.available() else None
    if live is None:
        live = _live(over, accept)
    live[0] = True
    # each old state's new number, -1 where it is dead, and -1 again at the end: a dead move (-1) reads it
    renumber = np.append(np.where(live, np.cumsum(live) - 1, -1), -1).astype(trans.dtype, copy=False)
    return renumber[trans[live]], accept[live]


def _live(trans: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """`trim`'s live states in Python: those that reach an accepting state."""
    ptr, preds = (a.tolist() for a in _predecessors(trans))
    stack = np.flatnonzero(accept >= 0).tolist()
    seen = set(stack)
    while stack:  # backwards from the accepting states, in Python: chains make numpy levels many and small
        t = stack.pop()
        for s in preds[ptr[t]:ptr[t + 1]]:
            if s not in seen:
                seen.add(s)
                stack.append(s)
    live = np.zeros(len(trans), bool)
    live[list(seen)] = True
    return live


def minimize(trans: np.ndarray, accept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The quotient by `refine`; the start state stays 0. `refine` starts from `_finite_classes`:
    Moore's rounds grow with the DFA's depth (thousands on an unrolled length bound), and there
    the finite part is exact in one pass. Natively (kernels/cpu/fsa.c) both are C, the refinement
    Hopcroft's: the same partition, so the same DFA."""
    native = native_fsa.available()
    labels = native_fsa.finite_classes(trans, accept) if native else None
    if labels is None:
        labels = _finite_classes(trans, accept)
    blocks = native_fsa.refine(trans, labels) if native else None
    if blocks is None:
        blocks = refine(trans, labels)
    _, first, block = np.unique(blocks, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))  # blocks numbered by first member, so start's block is 0
    part, reps = rank[block.ravel()], np.sort(first)
    return np.where(trans[reps] >= 0, part[np.maximum(trans[reps], 0)], -1), accept[reps]


def _finite_classes(trans: np.ndarray, accept: np.ndarray) -> np.ndarray:
    """Labels for `refine` that are already exact on the states that reach no cycle: those are
    classed from the sinks back (a state's class is its label and its successors' classes), the
    rest keep their own label apart. Neither can match the other: a state reaching a cycle has
    infinitely many strings that do not lead to the dead state, the others finitely many.

    Classed a height (longest live path) at a time, as equivalent states share it: a wide height
    as rows at once; a narrow one (chains) state by state, by its live transitions only. (kernels/cpu/fsa.c's
    rl_finite_classes gives the same partition, numbered otherwise: only the partition matters to `refine`.)"""
    n = len(trans)
    src, col = np.nonzero(trans >= 0)
    ptr = np.searchsorted(src, np.arange(n + 1)).tolist()
    cols, targets, labels = col.tolist(), trans[src, col].tolist(), accept.tolist()
    succ = np.where(trans >= 0, trans, n)  # state n: dead, class -1
    classes: list[int] = [-1] * n  # read by narrow heights
    table = np.full(n + 1, -1, np.int64)  # read by wide heights; narrow ones' classes wait in `unsynced`
    unsynced: list[int] = []
    count = 0
    for level in heights(trans):
        if len(level) >= _WIDE_LEVEL:
            table[unsynced] = [classes[s] for s in unsynced]
            unsynced = []
            rows = np.array(level, np.int64)
            ids = row_ids(np.column_stack([accept[rows], table[succ[rows]]])) + count
            table[rows] = ids
            for s, c in zip(level, ids.tolist()):
                classes[s] = c
            count = int(ids.max()) + 1
            continue
        seen: dict[tuple[int, ...], int] = {}
        for s in level:
            lo, hi = ptr[s], ptr[s + 1]
            signature = (labels[s], *cols[lo:hi], *[classes[t] for t in targets[lo:hi]])
            classes[s] = seen.setdefault(signature, count + len(seen))
        count += len(seen)
        unsynced += level
    finite = np.array(classes, np.int64)
    return np.where(finite >= 0, finite, count + 1 + accept)


_WIDE_LEVEL = 32  # states of one height from which one numpy pass beats a Python loop


def heights(trans: np.ndarray) -> list[list[int]]:
    """The states that reach no cycle, each after all its successors (Kahn's order from the sinks
    back, a level per length of the longest live path; in Python: chains make levels many and small)."""
    ptr, preds = (a.tolist() for a in _predecessors(trans))
    pending = np.bincount(np.asarray(preds, np.int64), minlength=len(trans)).tolist()  # distinct successors
    levels, level = [], [s for s, k in enumerate(pending) if not k]
    while level:
        levels.append(level)
        nxt = []
        for s in level:
            for p in preds[ptr[s]:ptr[s + 1]]:
                pending[p] -= 1
                if not pending[p]:
                    nxt.append(p)
        level = nxt
    return levels


def refine(trans: np.ndarray, labels: np.ndarray, rounds: int | None = None) -> np.ndarray:
    """Moore's partition refinement: block ids such that two states share a block iff they agree on
    every string of at most `rounds` symbols (all strings if None): alive or dead, and the label.

    Incremental: when a block splits, its largest part keeps the id, and a round re-reads only the
    states with a successor that moved (plus one unmoved reference per block they are in).
    """
    n = len(trans)
    succ = np.where(trans >= 0, trans, n)  # index n is "dead": block -1
    block = np.append(row_ids(labels[:, None]), -1)
    count = int(block.max()) + 1
    pred_ptr, preds = _predecessors(trans)
    moved = np.arange(n)
    for _ in itertools.count() if rounds is None else range(rounds):
        deadline.check()
        dirty = np.zeros(n, bool)
        dirty[_gather(pred_ptr, preds, moved)] = True
        touched = np.zeros(count, bool)
        touched[block[:n][dirty]] = True
        steady = np.flatnonzero(touched[block[:n]] & ~dirty)
        refs = steady[np.unique(block[steady], return_index=True)[1]]  # rows of the unmoved rest
        sub = np.concatenate([refs, np.flatnonzero(dirty)])
        ids = row_ids(np.column_stack([block[sub], block[succ[sub]]]))
        part_block, new_ids = _split_ids(ids, block[sub], len(refs), count)
        if not len(new_ids):
            break
        count += len(new_ids)
        old = block[sub]
        block[sub] = part_block[ids]
        moved = sub[block[sub] != old]
    return block[:n]


def _split_ids(ids: np.ndarray, old: np.ndarray, num_refs: int, count: int) -> tuple[np.ndarray, np.ndarray]:
    """Block id per part (parts = `ids`, all within blocks `old`): each block's part holding its
    reference (the first `num_refs` rows), else its largest part, keeps the block's id; the other
    parts get fresh ids from `count` on (returned second)."""
    firsts = np.unique(ids, return_index=True)[1]
    size = np.bincount(ids) + np.bincount(ids[:num_refs], minlength=len(firsts)) * len(ids)
    order = np.lexsort((-size, old[firsts]))
    keeps = np.zeros(len(firsts), bool)
    keeps[order[np.unique(old[firsts][order], return_index=True)[1]]] = True
    fresh = count + np.arange(int((~keeps).sum()))
    part_block = old[firsts].copy()
    part_block[~keeps] = fresh
    return part_block, fresh


def _predecessors(trans: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """CSR of the distinct states leading into each state: preds[ptr[t]:ptr[t + 1]]."""
    ordered = np.sort(trans, axis=1)
    first = np.ones(ordered.shape, bool)
    first[:, 1:] = ordered[:, 1:] != ordered[:, :-1]
    src, col = np.nonzero(first & (ordered >= 0))
    dst = ordered[src, col]
    order = np.argsort(dst, kind="stable")
    return np.searchsorted(dst[order], np.arange(len(trans) + 1)), src[order]


def _gather(ptr: np.ndarray, values: np.ndarray, keys: np.ndarray) -> np.ndarray:
    """values[ptr[k]:ptr[k + 1]] for every k in keys, concatenated."""
    counts = ptr[keys + 1] - ptr[keys]
    starts = np.repeat(ptr[keys] - np.cumsum(counts) + counts, counts)
    return values[starts + np.arange(counts.sum())]


def row_ids(rows: np.ndarray) -> np.ndarray:
    """Dense ids, equal exactly where the rows are equal: rows hashed to one integer (fast), then
    checked, and sorted whole only on a hash collision."""
    rows = np.ascontiguousarray(rows, np.int64)
    keys = rows @ hash_weights(rows.shape[1])  # wraps modulo 2**64
    _, first, ids = np.unique(keys, return_index=True, return_inverse=True)
    ids = ids.ravel()
    if np.array_equal(rows[first[ids]], rows):
        return ids
    return np.unique(rows, axis=0, return_inverse=True)[1].ravel()


@functools.cache
def hash_weights(width: int) -> np.ndarray:
    return np.random.default_rng(width).integers(1, 2**62, width, dtype=np.int64) * 2 + 1
