"""BNF productions -> an LALR(1) table, built directly: LR(0) states, then DeRemer-Pennello lookaheads.

JSON-schema grammars come as rules of regex trees; writing them out as Lark text and having Lark parse
it back cost more than the table itself. Sets of terminals are Python ints (a bit per terminal).
Conflicts resolve as Lark resolves them: shift over reduce; two reductions on one terminal are an error,
or, with `forks`, both kept (lalr.FORK: the parser follows each, as GLR does).
"""
from __future__ import annotations

import itertools
from collections import defaultdict
from typing import Any, Callable

import numpy as np

from .. import deadline
from ..masks.vocab_trie import expand_ranges
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
    """The LR(0) automaton: per state its transitions and the productions it completes (in production order).

    An item (production p, dot d) is the number `first[p] + d`, so a kernel is a frozenset of ints (hashing
    tuples was most of the time), and the closure a kernel adds depends only on the rules right after its
    dots: its moves are computed once per such set of rules and kept."""

    def __init__(self, prods: list[Production], by_rule: dict[str, list[int]]):
        self.goto: list[dict[str, int]] = []
        self.completed: list[list[int]] = []
        first: list[int] = []
        after: list[str | None] = []  # per item: the symbol after its dot, None at the production's end
        item_prod: list[int] = []  # per item: its production
        for p, (_, rhs) in enumerate(prods):
            first.append(len(after))
            after += rhs
            after.append(None)
            item_prod += [p] * (len(rhs) + 1)
        leftmost = _leftmost_rules(prods, by_rule)
        closures: dict[frozenset[str], tuple[dict[str, list[int]], list[int]]] = {}

        def closure(rules_after: frozenset[str]) -> tuple[dict[str, list[int]], list[int]]:
            """The moves (symbol -> items past it) and the empty productions of the closure's items."""
            moves: dict[str, list[int]] = {}
            empty = []
            for rule in frozenset().union(*(leftmost[r] for r in rules_after)):
                for p in by_rule[rule]:
                    sym = after[first[p]]
                    if sym is None:
                        empty.append(p)
                    else:
                        moves.setdefault(sym, []).append(first[p] + 1)
            return moves, empty

        kernels: list[frozenset[int]] = [frozenset({first[0]})]
        ids = {kernels[0]: 0}
        while len(self.goto) < len(kernels):
            if not len(self.goto) & 255:
                deadline.check()
            moves: dict[str, list[int]] = {}
            done = []
            rules_after = set()
            for item in kernels[len(self.goto)]:
                sym = after[item]
                if sym is None:
                    done.append(item_prod[item])
                    continue
                moves.setdefault(sym, []).append(item + 1)
                if sym in by_rule:
                    rules_after.add(sym)
            if rules_after:
                key = frozenset(rules_after)
                hit = closures.get(key)
                if hit is None:
                    hit = closures[key] = closure(key)
                for sym, items in hit[0].items():
                    held = moves.get(sym)
                    moves[sym] = items if held is None else held + items
                done += hit[1]
            row = {}
            for sym, items in moves.items():
                kernel = frozenset(items)
                t = ids.get(kernel)
                if t is None:
                    t = ids[kernel] = len(kernels)
                    kernels.append(kernel)
                row[sym] = t
            self.goto.append(row)
            done.sort()
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
    """LA(state, production) as terminal bits (DeRemer & Pennello: reads, includes, lookback).

    The walks that find includes and lookback (each rule transition, each production of its rule, along its
    symbols) run over numpy arrays one symbol position at a time for all of them at once: ~10^5 dict lookups
    in Python were most of a large grammar's table. The digraphs' sets stay Python ints (bits per terminal)."""
    goto = states.goto
    sym_id = {rule: i for i, rule in enumerate(by_rule)}  # rules first: a symbol is a rule iff its id < num_rules
    num_rules = len(sym_id)
    for _, rhs in prods:
        for sym in rhs:
            sym_id.setdefault(sym, len(sym_id))
    num_syms = len(sym_id)
    # the LR(0) edges, sorted by (state, symbol): a state's edges are a slice, an edge is found by bisection
    widths = np.fromiter(map(len, goto), np.int64, len(goto))
    total = int(widths.sum())
    keys = np.repeat(np.arange(len(goto), dtype=np.int64), widths) * num_syms \
        + np.fromiter(map(sym_id.__getitem__, itertools.chain.from_iterable(goto)), np.int64, total)
    targets = np.fromiter(itertools.chain.from_iterable(row.values() for row in goto), np.int64, total)
    order = np.argsort(keys, kind="stable")
    keys, targets = keys[order], targets[order]
    edge_syms = keys % num_syms
    trans_edges = np.flatnonzero(edge_syms < num_rules)  # the rule transitions, numbered in key order
    trans_of_edge = np.full(total, -1, np.int64)
    trans_of_edge[trans_edges] = np.arange(len(trans_edges))
    trans_start = keys[trans_edges] // num_syms
    trans_rule = edge_syms[trans_edges]
    trans_target = targets[trans_edges].tolist()

    def edge(state: np.ndarray, sym: np.ndarray) -> np.ndarray:
        wanted = state * num_syms + sym
        found = np.minimum(np.searchsorted(keys, wanted), total - 1)
        if not (keys[found] == wanted).all():
            raise AssertionError("an LR(0) walk left the automaton")
        return found

    # reads and direct reads: per target state, its terminals and its nullable rules' transitions
    nullable_ids = np.zeros(num_syms, bool)
    nullable_ids[[sym_id[r] for r in nullable if r in sym_id]] = True
    nullable_edges = np.flatnonzero(nullable_ids[edge_syms])
    reads_of_state: dict[int, list[int]] = defaultdict(list)
    for state, t in zip((keys[nullable_edges] // num_syms).tolist(), trans_of_edge[nullable_edges].tolist()):
        reads_of_state[state].append(t)
    shifted: dict[int, int] = {}
    for r in set(trans_target):
        bits = 0
        for sym in goto[r]:
            if sym not in by_rule:
                bits |= bit_of[sym]
        shifted[r] = bits
    direct = [shifted[r] for r in trans_target]
    reads = [reads_of_state.get(r, []) for r in trans_target]
    # includes and lookback: every (transition, production of its rule) walked at once, a symbol at a time
    includes, ends, walk_prod, walk_trans = _walks(prods, list(by_rule.values()), sym_id, nullable_ids, edge, targets,
                                                   trans_of_edge, trans_start, trans_rule)
    follow = _digraph(includes, _digraph(reads, direct))
    out: dict[tuple[int, int], int] = {}
    for key, i in zip(zip(ends.tolist(), walk_prod.tolist()), walk_trans.tolist()):
        out[key] = out.get(key, 0) | follow[i]
    return out


def _walks(prods: list[Production], rule_prods: list[list[int]], sym_id: dict[str, int], nullable_ids: np.ndarray,
           edge: Callable[[np.ndarray, np.ndarray], np.ndarray], targets: np.ndarray, trans_of_edge: np.ndarray,
           trans_start: np.ndarray, trans_rule: np.ndarray) -> tuple[list[list[int]], np.ndarray, np.ndarray, np.ndarray]:
    """Each rule transition (`trans_start`, `trans_rule`) walked along each production of its rule (`rule_prods`,
    by rule id): (includes per transition, and per walk its end state, production and transition: lookback).
    Symbols are `sym_id`'s numbers, rules first; `edge` finds the LR(0) edges of (states, symbols)."""
    num_rules = len(rule_prods)
    lengths = np.fromiter((len(rhs) for _, rhs in prods), np.int64, len(prods))
    rhs_ids = np.full((len(prods), int(lengths.max()) or 1), -1, np.int64)
    rhs_ids[np.repeat(np.arange(len(prods)), lengths), expand_ranges(np.zeros(len(prods), np.int64), lengths)] = [
        sym_id[s] for _, rhs in prods for s in rhs]
    # a symbol at k >= last is followed by nullable symbols alone: last is where the production's last symbol that
    # is not a nullable rule stands (0 where there is none)
    solid = (rhs_ids >= 0) & ~nullable_ids[rhs_ids]
    last = np.where(solid.any(axis=1), rhs_ids.shape[1] - 1 - np.argmax(solid[:, ::-1], axis=1), 0)
    counts = np.fromiter(map(len, rule_prods), np.int64, num_rules)
    firsts = np.concatenate(([0], np.cumsum(counts)[:-1]))
    flat_prods = np.fromiter(itertools.chain.from_iterable(rule_prods), np.int64, int(counts.sum()))
    per_trans = counts[trans_rule]
    walk_trans = np.repeat(np.arange(len(trans_rule)), per_trans)
    walk_prod = flat_prods[expand_ranges(firsts[trans_rule], per_trans)]
    state = trans_start[walk_trans]
    walk_len, walk_last = lengths[walk_prod], last[walk_prod]
    sources, includers = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for k in range(rhs_ids.shape[1]):
        live = np.flatnonzero(walk_len > k)
        if not len(live):
            break
        sym = rhs_ids[walk_prod[live], k]
        found = edge(state[live], sym)
        inc = (walk_last[live] <= k) & (sym < num_rules)
        sources.append(trans_of_edge[found[inc]])
        includers.append(walk_trans[live[inc]])
        state[live] = targets[found]
    includes: list[list[int]] = [[] for _ in trans_rule]
    for x, i in zip(np.concatenate(sources).tolist(), np.concatenate(includers).tolist()):
        includes[x].append(i)
    return includes, state, walk_prod, walk_trans


def _digraph(edges: list[list[int]], base: list[int]) -> list[int]:
    """F(x) = base(x) | F(y) for every edge x -> y, to the fixpoint (strongly connected parts share F): Tarjan's
    traversal, iterative; a node with no edges is settled where it is met (most are, in JSON-schema grammars)."""
    n = len(base)
    value = list(base)
    depth = [0] * n  # 0: not met; its place on `stack` while open; `done` once settled
    done = n + 1
    stack: list[int] = []
    for root in range(n):
        if depth[root]:
            continue
        if not edges[root]:
            depth[root] = done
            continue
        stack.append(root)
        depth[root] = entered = len(stack)
        work = [(root, 0, entered)]  # (node, its next edge, its place on the stack)
        while work:
            x, k, d = work.pop()
            out = edges[x]
            while k < len(out):
                y = out[k]
                k += 1
                dy = depth[y]
                if not dy:
                    if not edges[y]:
                        depth[y] = done
                        value[x] |= value[y]
                        continue
                    work.append((x, k, d))  # x resumes after y
                    stack.append(y)
                    depth[y] = len(stack)
                    work.append((y, 0, len(stack)))
                    break
                if dy < depth[x]:
                    depth[x] = dy
                value[x] |= value[y]
            else:  # every edge of x is done
                if depth[x] == d:
                    while True:
                        top = stack.pop()
                        depth[top] = done
                        value[top] = value[x]
                        if top == x:
                            break
                if work:
                    parent = work[-1][0]
                    if depth[x] < depth[parent]:
                        depth[parent] = depth[x]
                    value[parent] |= value[x]
    return value
