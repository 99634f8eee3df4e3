"""BNF productions -> an LALR(1) table, built directly: LR(0) states, then DeRemer-Pennello lookaheads.

JSON-schema grammars come as rules of regex trees; writing them out as Lark text and having Lark parse
it back cost more than the table itself. Sets of terminals are Python ints (a bit per terminal).
Conflicts resolve as Lark resolves them: shift over reduce; two reductions on one terminal are an error,
or, with `forks`, both kept (lalr.FORK: the parser follows each, as GLR does).
"""
from __future__ import annotations

from collections import defaultdict
from typing import Any

from .. import deadline
from ..regex.fsa import reach
from .lalr import END, FORK, LalrTable

Production = tuple[str, tuple[str, ...]]  # (rule, symbols)
_ROOT = "$root"


def build_table(productions: list[Production], terminals: set[str], start: str = "start",
                forks: bool = False) -> LalrTable:
    """The LALR(1) table of `productions` (symbols not in `terminals` are rules). Raises ValueError on a
    rule that is used but never defined, and on a reduce/reduce conflict unless `forks` keeps it."""
    prods = [(_ROOT, (start, END)), *productions]
    by_rule: dict[str, list[int]] = defaultdict(list)
    for i, (rule, _) in enumerate(prods):
        by_rule[rule].append(i)
    for _, rhs in prods:
        for sym in rhs:
            if sym not in terminals and sym != END and sym not in by_rule:
                raise ValueError(f"rule {sym!r} is used but not defined")
    states = _Lr0(prods, by_rule)
    names = [END, *sorted(terminals)]
    lookahead = _lookaheads(prods, by_rule, states, _nullable(prods), {t: 1 << i for i, t in enumerate(names)})
    actions: dict[int, dict[str, tuple[bool | None, Any]]] = {}  # (True, state), (False, (size, rule)), FORK
    for s, row_goto in enumerate(states.goto):
        row: dict[str, tuple[bool | None, Any]] = {sym: (True, t) for sym, t in row_goto.items() if sym != END}
        for p in states.completed[s]:
            la = lookahead.get((s, p), 0)
            rule, rhs = prods[p]
            while la:
                low = la & -la
                la ^= low
                term = names[low.bit_length() - 1]
                held = row.get(term)
                if held is not None and held[0]:
                    continue  # shift wins
                reduce = (len(rhs), rule)
                if held is None:
                    row[term] = (False, reduce)
                    continue
                ways = (held[1],) if held[0] is False else held[1]
                if reduce in ways:
                    continue  # the same reduction
                if not forks:
                    raise ValueError(f"reduce/reduce conflict on {term} between rules {ways[0][1]} and {rule}")
                row[term] = (FORK, (*ways, reduce))
        actions[s] = row
    symbols = [""] * len(states.goto)  # each LR(0) state's accessing symbol: what a stack node above it read
    for row_goto in states.goto:
        for sym, t in row_goto.items():
            symbols[t] = sym
    return LalrTable(actions, 0, states.goto[0][start], symbols=symbols)


def _nullable(prods: list[Production]) -> set[str]:
    """The rules that derive the empty string: a worklist, linear in the grammar (rounds over every
    production took one round per link of a chain of nullable rules: member graphs make long ones)."""
    uses: dict[str, list[int]] = defaultdict(list)  # symbol -> the productions it occurs in, once per occurrence
    left = [len(rhs) for _, rhs in prods]  # symbols of each production not yet known nullable
    for i, (_, rhs) in enumerate(prods):
        for sym in rhs:
            uses[sym].append(i)
    out = {rule for rule, rhs in prods if not rhs}
    queue = list(out)
    while queue:
        for i in uses[queue.pop()]:
            left[i] -= 1
            if not left[i] and prods[i][0] not in out:
                out.add(prods[i][0])
                queue.append(prods[i][0])
    return out


class _Lr0:
    """The LR(0) automaton: per state its transitions and the productions it completes."""

    def __init__(self, prods: list[Production], by_rule: dict[str, list[int]]):
        self.goto: list[dict[str, int]] = []
        self.completed: list[list[int]] = []
        leftmost = _leftmost_rules(prods, by_rule)
        kernels: list[frozenset[tuple[int, int]]] = [frozenset({(0, 0)})]
        ids = {kernels[0]: 0}
        while len(self.goto) < len(kernels):
            if not len(self.goto) & 255:
                deadline.check()
            kernel = kernels[len(self.goto)]
            rules: set[str] = set()
            for p, d in kernel:
                rhs = prods[p][1]
                if d < len(rhs) and rhs[d] in by_rule:
                    rules |= leftmost[rhs[d]]
            items = [*kernel, *((p, 0) for r in rules for p in by_rule[r])]
            moves: dict[str, set[tuple[int, int]]] = defaultdict(set)
            done = []
            for p, d in items:
                rhs = prods[p][1]
                if d < len(rhs):
                    moves[rhs[d]].add((p, d + 1))
                else:
                    done.append(p)
            row = {}
            for sym, nxt in moves.items():
                key = frozenset(nxt)
                t = ids.get(key)
                if t is None:
                    t = ids[key] = len(kernels)
                    kernels.append(key)
                row[sym] = t
            self.goto.append(row)
            self.completed.append(done)


def _leftmost_rules(prods: list[Production], by_rule: dict[str, list[int]]) -> dict[str, frozenset[str]]:
    """Per rule: itself and the rules that can begin its productions, transitively (LR(0) closure)."""
    first: dict[str, set[str]] = defaultdict(set)
    for rule, rhs in prods:
        if rhs and rhs[0] in by_rule:
            first[rule].add(rhs[0])
    return {rule: frozenset(reach(first, (rule,))) for rule in by_rule}


def _lookaheads(prods: list[Production], by_rule: dict[str, list[int]], states: _Lr0, nullable: set[str],
                bit_of: dict[str, int]) -> dict[tuple[int, int], int]:
    """LA(state, production) as terminal bits (DeRemer & Pennello: reads, includes, lookback)."""
    trans = [(p, sym) for p, row in enumerate(states.goto) for sym in row if sym in by_rule]
    index = {t: i for i, t in enumerate(trans)}
    direct = [0] * len(trans)
    reads: list[list[int]] = [[] for _ in trans]
    for i, (p, rule) in enumerate(trans):
        r = states.goto[p][rule]
        for sym in states.goto[r]:
            if sym in by_rule:
                if sym in nullable:
                    reads[i].append(index[(r, sym)])
            else:
                direct[i] |= bit_of[sym]
    includes: list[list[int]] = [[] for _ in trans]
    lookback: dict[tuple[int, int], list[int]] = defaultdict(list)
    tail = [_nullable_tail(rhs, nullable) for _, rhs in prods]  # per production, not per transition using it
    for i, (start, rule) in enumerate(trans):
        for p in by_rule[rule]:
            rhs, state, last = prods[p][1], start, tail[p] - 1
            for k, sym in enumerate(rhs):
                if k >= last and sym in by_rule:
                    includes[index[(state, sym)]].append(i)
                state = states.goto[state][sym]
            lookback[(state, p)].append(i)
    follow = _digraph(includes, _digraph(reads, direct))
    out = {}
    for key, sources in lookback.items():
        bits = 0
        for i in sources:
            bits |= follow[i]
        out[key] = bits
    return out


def _nullable_tail(rhs: tuple[str, ...], nullable: set[str]) -> int:
    """Where the production's nullable suffix starts: a symbol at k is followed by nullable ones alone iff
    k + 1 >= this."""
    k = len(rhs)
    while k and rhs[k - 1] in nullable:
        k -= 1
    return k


def _digraph(edges: list[list[int]], base: list[int]) -> list[int]:
    """F(x) = base(x) | F(y) for every edge x -> y, to the fixpoint (strongly connected parts share F)."""
    n = len(base)
    value = list(base)
    depth = [0] * n
    stack: list[int] = []
    done = n + 1
    for root in range(n):
        if depth[root]:
            continue
        stack.append(root)
        depth[root] = len(stack)
        work = [(root, 0, len(stack))]
        while work:
            x, k, d = work[-1]
            if k < len(edges[x]):
                work[-1] = (x, k + 1, d)
                y = edges[x][k]
                if not depth[y]:
                    stack.append(y)
                    depth[y] = len(stack)
                    work.append((y, 0, len(stack)))
                else:
                    depth[x] = min(depth[x], depth[y])
                    value[x] |= value[y]
                continue
            work.pop()
            if depth[x] == d:
                while True:
                    top = stack.pop()
                    depth[top] = done
                    value[top] = value[x]
                    if top == x:
                        break
            if work:
                parent = work[-1][0]
                depth[parent] = min(depth[parent], depth[x])
                value[parent] |= value[x]
    return value
