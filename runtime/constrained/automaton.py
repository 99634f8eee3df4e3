"""Regex trees -> byte-level DFAs: UTF-8 expansion, Thompson NFA, subset construction, minimization.

A `Dfa` reads raw bytes. `trans[s, b]` is the next state or -1 (dead); every live state can still
reach an accepting one (dead ends are trimmed), so "alive" always means "completable". `accept[s]`
is the index of the preferred pattern that accepts in s (the lowest index), or -1.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..config import MAX_DFA_STATES, MAX_NFA_STATES
from . import regex_ast as ra


@dataclass(slots=True)
class Dfa:
    trans: np.ndarray  # [S, 256] int32, -1 = dead
    accept: np.ndarray  # [S] int32, -1 = not accepting, else the accepted pattern's index
    start: int = 0

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])

    def walk(self, state: int, data: bytes) -> int:
        """The state after `data`, or -1."""
        trans = self.trans
        for b in data:
            state = int(trans[state, b])
            if state < 0:
                return -1
        return state

    def is_finite(self) -> bool:
        """Whether the language is finite (no cycle among live states)."""
        color = np.zeros(self.num_states, np.int8)
        stack = [(self.start, iter(np.unique(self.trans[self.start][self.trans[self.start] >= 0])))]
        color[self.start] = 1
        while stack:
            state, children = stack[-1]
            child = next(children, None)
            if child is None:
                color[state] = 2
                stack.pop()
            elif color[child] == 1:
                return False
            elif color[child] == 0:
                color[child] = 1
                row = self.trans[child]
                stack.append((int(child), iter(np.unique(row[row >= 0]))))
        return True


def compile_dfa(patterns: list[ra.Node], nonempty: bool = False) -> Dfa:
    """One DFA for the union of `patterns`; `nonempty` drops the empty match (lexer terminals)."""
    nfa = _Nfa()
    start = nfa.new()
    if nonempty:  # a start state nothing leads back into, so its acceptance can be dropped alone
        inner = nfa.new()
        nfa.eps[start].append(inner)
        start_body = inner
    else:
        start_body = start
    for label, pattern in enumerate(patterns):
        s = nfa.new()
        nfa.eps[start_body].append(s)
        nfa.accepts[nfa.build(pattern, s)] = label
    return _determinize(nfa, start, drop_start_accept=nonempty)


def exactly_one(dfas: list[Dfa]) -> Dfa:
    """Strings that exactly one of `dfas` accepts (JSON schema oneOf), by a product construction."""
    start = tuple(d.start for d in dfas)
    dead = np.full(256, -1, np.int32)
    ids, order, rows = {start: 0}, [start], []
    while len(rows) < len(order):
        nxt = np.stack([d.trans[q] if q >= 0 else dead for d, q in zip(dfas, order[len(rows)])])
        cols, which = np.unique(nxt.T, axis=0, return_inverse=True)
        row = np.full(256, -1, np.int64)
        for k, col in enumerate(cols):
            target = tuple(int(x) for x in col)
            if max(target) < 0:
                continue
            if target not in ids:
                if len(ids) >= MAX_DFA_STATES:
                    raise ValueError(f"constraint is too large: its DFA exceeds {MAX_DFA_STATES} states")
                ids[target] = len(order)
                order.append(target)
            row[which.ravel() == k] = ids[target]
        rows.append(row)
    accept = np.array([0 if sum(q >= 0 and d.accept[q] >= 0 for d, q in zip(dfas, t)) == 1 else -1 for t in order])
    trans, accept = _minimize(*_trim(np.array(rows), accept))
    return Dfa(trans.astype(np.int32), accept.astype(np.int32))


# ---- NFA ----------------------------------------------------------------------------------------
class _Nfa:
    def __init__(self) -> None:
        self.eps: list[list[int]] = []
        self.edges: list[list[tuple[int, int, int]]] = []  # (byte lo, byte hi, target)
        self.accepts: dict[int, int] = {}

    def new(self) -> int:
        if len(self.eps) >= MAX_NFA_STATES:
            raise ValueError(f"constraint is too large: its automaton exceeds {MAX_NFA_STATES} NFA states")
        self.eps.append([])
        self.edges.append([])
        return len(self.eps) - 1

    def build(self, node: ra.Node, s: int) -> int:
        """Adds `node` starting at state s; returns its end state."""
        if isinstance(node, ra.Chars):
            end = self.new()
            for path in _utf8_paths(node.ranges):
                cur = s
                for i, (lo, hi) in enumerate(path):
                    nxt = end if i == len(path) - 1 else self.new()
                    self.edges[cur].append((lo, hi, nxt))
                    cur = nxt
            return end
        if isinstance(node, ra.Seq):
            for item in node.items:
                s = self.build(item, s)
            return s
        if isinstance(node, ra.Alt):
            end = self.new()
            for item in node.items:
                branch = self.new()
                self.eps[s].append(branch)
                self.eps[self.build(item, branch)].append(end)
            return end
        if isinstance(node, ra.Repeat):
            return self._repeat(node, s)
        if isinstance(node, ra.Bounded):
            return self._bounded(node, s)
        if isinstance(node, ra.Compiled):
            return self._embed(node.dfa, s)
        raise ValueError(f"grammar rule reference {node} cannot appear inside a regular expression")

    def _repeat(self, node: ra.Repeat, s: int) -> int:
        for _ in range(node.min):
            s = self.build(node.item, s)
        if node.max is None:
            loop = self.new()
            self.eps[s].append(loop)
            self.eps[self.build(node.item, loop)].append(loop)
            return loop
        end = self.new()
        self.eps[s].append(end)
        for _ in range(node.max - node.min):
            s = self.build(node.item, s)
            self.eps[s].append(end)
        return end

    def _embed(self, dfa: Dfa, s: int) -> int:
        """Copies a DFA in, its start at state s."""
        states = [s if q == dfa.start else self.new() for q in range(dfa.num_states)]
        end = self.new()
        for q in range(dfa.num_states):
            if dfa.accept[q] >= 0:
                self.eps[states[q]].append(end)
            for b in np.flatnonzero(dfa.trans[q] >= 0).tolist():
                self.edges[states[q]].append((b, b, states[int(dfa.trans[q, b])]))
        return end

    def _bounded(self, node: ra.Bounded, s: int) -> int:
        """Unrolls the item's DFA `max_bytes` deep, so no match is longer than that."""
        dfa = compile_dfa([node.item])
        end = self.new()
        layer = {dfa.start: s}
        for depth in range(node.max_bytes + 1):
            nxt: dict[int, int] = {}
            for q, nfa_state in layer.items():
                if dfa.accept[q] >= 0:
                    self.eps[nfa_state].append(end)
                if depth == node.max_bytes:
                    continue
                row = dfa.trans[q]
                for b in np.nonzero(row >= 0)[0].tolist():
                    target = int(row[b])
                    if target not in nxt:
                        nxt[target] = self.new()
                    self.edges[nfa_state].append((b, b, nxt[target]))
            layer = nxt
        return end


def _utf8_paths(ranges: ra.Ranges) -> list[list[tuple[int, int]]]:
    paths: list[list[tuple[int, int]]] = []
    for lo, hi in ranges:
        _split_utf8(lo, hi, paths)
    return paths


def _split_utf8(lo: int, hi: int, out: list) -> None:
    """Byte-range paths for code points lo..hi: split until each byte position spans a plain range."""
    for top in (0x7F, 0x7FF, 0xFFFF):
        if lo <= top < hi:
            _split_utf8(lo, top, out)
            _split_utf8(top + 1, hi, out)
            return
    if hi <= 0x7F:
        out.append([(lo, hi)])
        return
    n = len(chr(lo).encode())
    for i in range(1, n):
        m = (1 << (6 * i)) - 1
        if lo & ~m != hi & ~m:
            if lo & m:
                _split_utf8(lo, lo | m, out)
                _split_utf8((lo | m) + 1, hi, out)
                return
            if hi & m != m:
                _split_utf8(lo, (hi & ~m) - 1, out)
                _split_utf8(hi & ~m, hi, out)
                return
    out.append(list(zip(chr(lo).encode(), chr(hi).encode())))


# ---- subset construction --------------------------------------------------------------------------
def _determinize(nfa: _Nfa, start: int, drop_start_accept: bool) -> Dfa:
    bounds = {0, 256}
    for edges in nfa.edges:
        for lo, hi, _ in edges:
            bounds.update((lo, hi + 1))
    cuts = np.array(sorted(bounds))
    byte_class = np.searchsorted(cuts, np.arange(256), side="right") - 1
    num_classes = len(cuts) - 1
    class_edges = [[(int(byte_class[lo]), int(byte_class[hi]), t) for lo, hi, t in edges] for edges in nfa.edges]

    closure_cache: dict[frozenset[int], frozenset[int]] = {}

    def closure(states: frozenset[int]) -> frozenset[int]:
        hit = closure_cache.get(states)
        if hit is None:
            seen, stack = set(states), list(states)
            while stack:
                for t in nfa.eps[stack.pop()]:
                    if t not in seen:
                        seen.add(t)
                        stack.append(t)
            hit = closure_cache[states] = frozenset(seen)
        return hit

    first = closure(frozenset((start,)))
    ids, order, rows = {first: 0}, [first], []
    while len(rows) < len(order):
        current = order[len(rows)]
        moves: dict[int, set[int]] = {}
        for q in current:
            for c0, c1, t in class_edges[q]:
                for c in range(c0, c1 + 1):
                    moves.setdefault(c, set()).add(t)
        row = np.full(num_classes, -1, np.int64)
        for c, targets in moves.items():
            target = closure(frozenset(targets))
            if target not in ids:
                if len(ids) >= MAX_DFA_STATES:
                    raise ValueError(f"constraint is too large: its DFA exceeds {MAX_DFA_STATES} states")
                ids[target] = len(order)
                order.append(target)
            row[c] = ids[target]
        rows.append(row)
    accept = np.array([min((nfa.accepts[q] for q in d if q in nfa.accepts), default=-1) for d in order])
    if drop_start_accept:
        accept[0] = -1
    trans, accept = _minimize(*_trim(np.array(rows).reshape(len(order), num_classes), accept))
    return Dfa(np.ascontiguousarray(trans[:, byte_class]).astype(np.int32), accept.astype(np.int32))


def _trim(trans: np.ndarray, accept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Removes states that cannot reach acceptance (start is kept as state 0 even if dead)."""
    live = accept >= 0
    while True:
        reach = live | ((trans >= 0) & live[np.maximum(trans, 0)]).any(axis=1)
        if (reach == live).all():
            break
        live = reach
    live[0] = True
    new_id = np.cumsum(live) - 1
    trans = np.where((trans >= 0) & live[np.maximum(trans, 0)], new_id[np.maximum(trans, 0)], -1)[live]
    return trans, accept[live]


def _minimize(trans: np.ndarray, accept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Moore's partition refinement; the start state stays 0."""
    part = np.unique(accept, return_inverse=True)[1].ravel()
    count = part.max() + 1
    while True:
        succ = np.where(trans >= 0, part[np.maximum(trans, 0)], -1)
        rows = np.ascontiguousarray(np.column_stack([part, succ]), dtype=np.int64)
        _, new = np.unique(rows.view(np.dtype((np.void, rows.shape[1] * 8))).ravel(), return_inverse=True)
        new = new.ravel()
        if new.max() + 1 == count:
            break
        part, count = new, new.max() + 1
    _, first, block = np.unique(part, return_index=True, return_inverse=True)
    rank = np.argsort(np.argsort(first))  # blocks numbered by first member, so start's block is 0
    part, reps = rank[block.ravel()], np.sort(first)
    new_trans = np.where(trans[reps] >= 0, part[np.maximum(trans[reps], 0)], -1)
    return new_trans, accept[reps]
