"""Alternatives that are containers of one kind (objects, or arrays), merged into one container whose
body reads the union of theirs, deterministically where they read alike.

An LALR parser cannot carry two readings of one text: `[]` as an empty array of either branch, or
`{"a":1}` as either of two objects whose optional members both start with `"a"`, is a reduce/reduce
conflict once the branches hold rules. Written as one automaton over their members (fsa's subset
construction, its symbols the members' sub-languages), the shared readings become one path, and
the union's language is unchanged. Members that differ only after a shared prefix keep that prefix as
one letter (each run of rule-free pieces is one letter, as each is one terminal of the grammar).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from ...config import MAX_NFA_STATES
from .. import deadline
from ..grammar.rule_grammar import ref_free_runs
from ..regex import regex_ast as ra
from ..regex.fsa import ConstraintTooLarge, Nfa, subsets

MAX_MERGED_STATES = 512  # a subset construction larger than this is left as separate alternatives


@dataclass(frozen=True, slots=True)
class Container:
    opening: str
    body: ra.Node
    closing: str


def merged_body(bodies: list[ra.Node], linked: dict[ra.Node, LinkedBody] | None = None) -> ra.Graph | None:
    """One deterministic graph (over member letters) reading the union of `bodies`; None where no
    sequence of letters ends two of them (their rules then never reduce on one text: nothing to merge),
    or where the graph would be too large. `linked` keeps each body's NFA across calls (a union that
    does not merge is tried again without its first member, so n members link n^2 / 2 bodies)."""
    letters = _Letters()
    nfa = letters.nfa
    start = nfa.new()
    try:
        for member, body in enumerate(bodies):
            entry, end = nfa.new(), nfa.new()
            nfa.eps[start].append(entry)
            nfa.accepts[end] = member
            if linked is None:
                letters.link(body, entry, end)
                continue
            held = linked.get(body)
            if held is None:
                held = linked[body] = LinkedBody.of(body)
            letters.paste(held, entry)
        trans, states = subsets(nfa, start, len(letters.symbols), limit=MAX_MERGED_STATES)
    except ConstraintTooLarge:
        return None
    ended: list[set[int]] = [set() for _ in range(len(trans))]  # members ending there
    for state, member in zip(*(a.tolist() for a in states.accepted(nfa.accepts))):
        ended[state].add(member)
    if not any(len(members) > 1 for members in ended):
        return None
    src, col = np.nonzero(trans >= 0)
    edges = tuple((s, letters.symbols[c], int(trans[s, c])) for s, c in zip(src.tolist(), col.tolist()))
    return ra.Graph(len(trans), edges, tuple(q for q, members in enumerate(ended) if members))


@dataclass(frozen=True, slots=True)
class LinkedBody:
    """One body's edges as `_Letters.link` writes them, its entry state 0 and its end 1, the others
    following: pasted at an entry (the end next to it), the NFA is the one `link` would write there,
    numbered, ordered and lettered alike (its letters numbered in the order `link` first reads them)."""
    eps: list[list[int]]
    edges: list[list[tuple[int, int]]]  # (index into letters, target)
    letters: list[ra.Node]

    @staticmethod
    def of(body: ra.Node) -> LinkedBody:
        own = _Letters()
        entry, end = own.nfa.new(), own.nfa.new()
        own.link(body, entry, end)
        return LinkedBody(own.nfa.eps, [[(symbol[0], t) for symbol, t in row] for row in own.nfa.edges], own.symbols)


class _Letters:
    """Members' bodies as an NFA (fsa) whose symbols are letters: sub-languages, each read as a whole."""

    def __init__(self) -> None:
        self.nfa = Nfa()
        self.symbols: list[ra.Node] = []  # by symbol id
        self._ids: dict[ra.Node, tuple[int]] = {}  # one tuple per letter: the subset construction groups by it

    def letter(self, node: ra.Node) -> tuple[int]:
        symbol = self._ids.get(node)
        if symbol is None:
            symbol = self._ids[node] = (len(self.symbols),)
            self.symbols.append(node)
        return symbol

    def read(self, src: int, node: ra.Node, dst: int) -> None:
        self.nfa.edges[src].append((self.letter(node), dst))

    def paste(self, body: LinkedBody, entry: int) -> None:
        """`body`'s NFA from `entry` to `entry + 1` (both new and bare), as `link` would write it."""
        nfa = self.nfa
        if entry + len(body.eps) > MAX_NFA_STATES:
            raise ConstraintTooLarge(f"constraint is too large: its automaton exceeds {MAX_NFA_STATES} NFA states")
        deadline.check()
        symbols: list[Sequence[int]] = [self.letter(node) for node in body.letters]
        eps = [[entry + t for t in row] for row in body.eps]
        edges = [[(symbols[c], entry + t) for c, t in row] for row in body.edges]
        nfa.eps[entry], nfa.eps[entry + 1] = eps[0], eps[1]
        nfa.edges[entry], nfa.edges[entry + 1] = edges[0], edges[1]
        nfa.eps.extend(eps[2:])
        nfa.edges.extend(edges[2:])

    def link(self, node: ra.Node, src: int, dst: int) -> None:
        """Edges from `src` to `dst` reading `node`; only parts that hold rules, or that may read nothing,
        are opened up (a letter that may read nothing would be a second way to skip it)."""
        nfa = self.nfa
        if node == ra.EMPTY:
            nfa.eps[src].append(dst)
        elif isinstance(node, ra.Ref) or not (ra.refs(node) or ra.nullable(node)):
            self.read(src, node, dst)
        elif isinstance(node, ra.Seq):
            self._chain(ref_free_runs(node.items) if ra.refs(node) else list(node.items), src, dst)
        elif isinstance(node, ra.Alt):
            for item in node.items:
                self.link(item, src, dst)
        elif isinstance(node, ra.Repeat):
            self._repeat(node, src, dst)
        elif isinstance(node, ra.Graph):
            ids = [nfa.new() for _ in range(node.num_states)]
            nfa.eps[src].append(ids[0])
            for a, label, b in node.edges:
                self.link(label, ids[a], ids[b])
            for f in node.finals:
                nfa.eps[ids[f]].append(dst)
        else:
            self.read(src, node, dst)

    def _chain(self, items: list[ra.Node], src: int, dst: int) -> None:
        for i, item in enumerate(items):
            nxt = dst if i == len(items) - 1 else self.nfa.new()
            self.link(item, src, nxt)
            src = nxt
        if not items:
            self.nfa.eps[src].append(dst)

    def _repeat(self, node: ra.Repeat, src: int, dst: int) -> None:
        nfa = self.nfa
        for _ in range(node.min):
            nxt = nfa.new()
            self.link(node.item, src, nxt)
            src = nxt
        if node.max is None:
            loop = nfa.new()
            nfa.eps[src].append(loop)
            self.link(node.item, loop, loop)
            nfa.eps[loop].append(dst)
            return
        for _ in range(node.max - node.min):
            nfa.eps[src].append(dst)
            nxt = nfa.new()
            self.link(node.item, src, nxt)
            src = nxt
        nfa.eps[src].append(dst)
