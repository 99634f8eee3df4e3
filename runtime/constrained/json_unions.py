"""Alternatives that are containers of one kind (objects, or arrays), merged into one container whose
body reads the union of theirs, deterministically where they read alike.

An LALR parser cannot carry two readings of one text: `[]` as an empty array of either branch, or
`{"a":1}` as either of two objects whose optional members both start with `"a"`, is a reduce/reduce
conflict once the branches hold rules. Written as one automaton over their members (a subset
construction whose letters are the members' sub-languages), the shared readings become one path, and
the union's language is unchanged. Members that differ only after a shared prefix keep that prefix as
one letter (each run of rule-free pieces is one letter, as each is one terminal of the grammar).
"""
from __future__ import annotations

from dataclasses import dataclass

from . import regex_ast as ra
from .rule_grammar import ref_free_runs

MAX_MERGED_STATES = 512  # a subset construction larger than this is left as separate alternatives


@dataclass(frozen=True, slots=True)
class Container:
    opening: str
    body: ra.Node
    closing: str


def merged_body(bodies: list[ra.Node]) -> ra.Graph | None:
    """One deterministic graph (over member letters) reading the union of `bodies`; None where no
    sequence of letters ends two of them (their rules then never reduce on one text: nothing to merge),
    or where the graph would be too large."""
    nfa = _Nfa()
    starts = [nfa.add(body) for body in bodies]
    owner = [i for i, (lo, hi) in enumerate(zip(starts, [*starts[1:], len(nfa.edges)])) for _ in range(lo, hi)]
    graph = nfa.determinize(starts)
    if graph is None or not any(len({owner[s] for s in subset & nfa.finals}) > 1 for subset in nfa.subsets):
        return None
    return graph


class _Nfa:
    """States with labelled edges; the label ra.EMPTY reads nothing."""

    def __init__(self) -> None:
        self.edges: list[list[tuple[ra.Node, int]]] = []
        self.finals: set[int] = set()
        self.subsets: dict[frozenset[int], int] = {}  # the determinized states, once built

    def state(self) -> int:
        self.edges.append([])
        return len(self.edges) - 1

    def add(self, body: ra.Node) -> int:
        start, end = self.state(), self.state()
        self.finals.add(end)
        self.link(body, start, end)
        return start

    def link(self, node: ra.Node, src: int, dst: int) -> None:
        """Edges from `src` to `dst` reading `node`; only parts that hold rules, or that may read nothing,
        are opened up (a letter that may read nothing would be a second way to skip it)."""
        if isinstance(node, ra.Ref) or node == ra.EMPTY or not (ra.refs(node) or ra.nullable(node)):
            self.edges[src].append((node, dst))
        elif isinstance(node, ra.Seq):
            self._chain(ref_free_runs(node.items) if ra.refs(node) else list(node.items), src, dst)
        elif isinstance(node, ra.Alt):
            for item in node.items:
                self.link(item, src, dst)
        elif isinstance(node, ra.Repeat):
            self._repeat(node, src, dst)
        elif isinstance(node, ra.Graph):
            ids = [self.state() for _ in range(node.num_states)]
            self.edges[src].append((ra.EMPTY, ids[0]))
            for a, label, b in node.edges:
                self.link(label, ids[a], ids[b])
            for f in node.finals:
                self.edges[ids[f]].append((ra.EMPTY, dst))
        else:
            self.edges[src].append((node, dst))

    def _chain(self, items: list[ra.Node], src: int, dst: int) -> None:
        for i, item in enumerate(items):
            nxt = dst if i == len(items) - 1 else self.state()
            self.link(item, src, nxt)
            src = nxt
        if not items:
            self.edges[src].append((ra.EMPTY, dst))

    def _repeat(self, node: ra.Repeat, src: int, dst: int) -> None:
        for _ in range(node.min):
            nxt = self.state()
            self.link(node.item, src, nxt)
            src = nxt
        if node.max is None:
            loop = self.state()
            self.edges[src].append((ra.EMPTY, loop))
            self.link(node.item, loop, loop)
            self.edges[loop].append((ra.EMPTY, dst))
            return
        for _ in range(node.max - node.min):
            self.edges[src].append((ra.EMPTY, dst))
            nxt = self.state()
            self.link(node.item, src, nxt)
            src = nxt
        self.edges[src].append((ra.EMPTY, dst))

    def closure(self, states: frozenset[int]) -> frozenset[int]:
        seen, stack = set(states), list(states)
        while stack:
            for label, nxt in self.edges[stack.pop()]:
                if label == ra.EMPTY and nxt not in seen:
                    seen.add(nxt)
                    stack.append(nxt)
        return frozenset(seen)

    def determinize(self, starts: list[int]) -> ra.Graph | None:
        first = self.closure(frozenset(starts))
        ids = self.subsets = {first: 0}
        queue = [first]
        edges: list[tuple[int, ra.Node, int]] = []
        finals: list[int] = []
        while queue:
            subset = queue.pop()
            src = ids[subset]
            if subset & self.finals:
                finals.append(src)
            moves: dict[ra.Node, set[int]] = {}
            for s in subset:
                for label, nxt in self.edges[s]:
                    if label != ra.EMPTY:
                        moves.setdefault(label, set()).add(nxt)
            for label, targets in moves.items():
                key = self.closure(frozenset(targets))
                if key not in ids:
                    if len(ids) >= MAX_MERGED_STATES:
                        return None
                    ids[key] = len(ids)
                    queue.append(key)
                edges.append((src, label, ids[key]))
        return ra.Graph(len(ids), tuple(edges), tuple(sorted(finals)))
