"""Rules of regex trees with `Ref`s (recursive JSON schemas) -> BNF productions -> an LALR(1) table.

Every maximal Ref-free piece becomes one terminal, so lexemes stay large (few parser steps) and the
terminal's exact language is handed to the engine directly. The exception is a piece holding a bounded
repeat of more than SPLIT_REPEAT copies of a structured item (an array's `maxItems: 100` of objects): as one
lexeme its DFA holds a copy of the item per count (hundreds of thousands of states, past the lexer's bound),
so the repeat's counting goes to the grammar (one helper rule per copy) and the item stays one terminal. Helper rules (optionals, repeats,
alternatives) are shared by content, and unbounded repeats are left-recursive, so that a parse of a
long array returns to the same stack after each item (masks are cached by parser state).
"""
from __future__ import annotations

from typing import Callable

from ..regex import regex_ast as ra
from .lalr import LalrGrammar, Terminal
from .lr_table import Production, build_table
from .member_check import MemberCheck, guards

Symbols = tuple[str, ...]

# a bounded repeat of more copies than this, of an item of 2 characters or more (an array's `,item`, not a
# string's character, raw or escaped: a string's length stays in its lexeme), is counted by rules
SPLIT_REPEAT = 16


def rules_grammar(root: ra.Node, rules: dict[str, ra.Node], field: str = "json_schema",
                  checks: tuple[MemberCheck, ...] = ()) -> LalrGrammar:
    """`field` names the request field the rules came from, in the error for a malformed grammar;
    `checks`: objects whose members the table checks as it reduces (member_check)."""
    writer = _Writer()
    writer.define("start", root)
    for name, body in rules.items():
        writer.define(name, body)
    terminals = {name: Terminal(name, node, (i,)) for i, (node, name) in enumerate(writer.terminals.items())}
    try:  # ambiguous or not LALR(1) where a union's alternatives read alike: the parser forks there
        table = build_table(writer.productions, set(terminals), forks=True)
    except ValueError as e:
        raise ValueError(f"{field}: {e}") from None
    table.guards, table.annotators = guards(checks)
    return LalrGrammar(table, terminals, frozenset(), readings=True)


class _Writer:
    def __init__(self) -> None:
        self.terminals: dict[ra.Node, str] = {}
        self.productions: list[Production] = []
        self._helpers: dict[tuple, str] = {}  # helper rules by kind and content: ("alts" | "star" | "graph", ...)
        self._expanded: dict[ra.Node, Symbols] = {}
        self._counts: dict[ra.Node, bool] = {}  # Ref-free nodes: whether one holds a repeat to split

    def define(self, name: str, body: ra.Node) -> None:
        for alt in body.items if isinstance(body, ra.Alt) and ra.refs(body) else (body,):
            self.productions.append((name, self.expand(alt)))

    def helper(self, alts: tuple[Symbols, ...]) -> str:
        """A rule whose productions are `alts` (one rule per distinct content)."""
        name = self._helpers.get(("alts", alts))
        if name is None:
            name = self._helpers[("alts", alts)] = f"${len(self._helpers)}"
            self.productions += [(name, a) for a in alts]
        return name

    def optional(self, symbols: Symbols) -> Symbols:
        return (self.helper((symbols, ())),) if symbols else ()

    def terminal(self, node: ra.Node) -> str:
        if node not in self.terminals:
            self.terminals[node] = f"T{len(self.terminals)}"
        return self.terminals[node]

    def expand(self, node: ra.Node) -> Symbols:
        """The symbols that derive `node`'s language (empty when it matches only the empty string)."""
        hit = self._expanded.get(node)
        if hit is None:
            hit = self._expanded[node] = self._expand(node)
        return hit

    def counts_items(self, node: ra.Node) -> bool:
        """Whether a Ref-free node holds a bounded repeat to split (see the module's docstring)."""
        hit = self._counts.get(node)
        if hit is None:
            if isinstance(node, ra.Repeat):
                hit = (node.max is not None and node.max > SPLIT_REPEAT and _min_chars(node.item) >= 2) \
                    or self.counts_items(node.item)
            elif isinstance(node, ra.Seq | ra.Alt):
                hit = any(self.counts_items(x) for x in node.items)
            elif isinstance(node, ra.Graph):
                hit = any(self.counts_items(x) for _, x, _ in node.edges)
            else:
                hit = False
            self._counts[node] = hit
        return hit

    def _expand(self, node: ra.Node) -> Symbols:
        if not ra.refs(node) and not self.counts_items(node):
            if node == ra.EMPTY:
                return ()
            name = self.terminal(node)  # the engine builds terminals without their empty match
            return self.optional((name,)) if ra.nullable(node) else (name,)
        if isinstance(node, ra.Ref):
            return (node.name,)
        if isinstance(node, ra.Graph):
            return (self.graph(node),)
        if isinstance(node, ra.Seq):
            runs = ref_free_runs(node.items, self.counts_items)
            return tuple(sym for group in runs for sym in self.expand(group))
        if isinstance(node, ra.Alt):
            return (self.helper(tuple(dict.fromkeys(self.expand(x) for x in node.items))),)
        assert isinstance(node, ra.Repeat), f"unexpected node {node!r} around a rule reference"
        return self.repeat(self.expand(node.item), node.min, node.max)

    def repeat(self, inner: Symbols, lo: int, hi: int | None) -> Symbols:
        if not inner:
            return ()
        if hi is None:
            key = ("star", inner)
            many = self._helpers.get(key)
            if many is None:  # left-recursive: `many: inner | many inner`
                many = self._helpers[key] = f"${len(self._helpers)}"
                self.productions += [(many, inner), (many, (many, *inner))]
            return inner * (lo - 1) + (many,) if lo else self.optional((many,))
        up_to: Symbols = ()  # 1..k more copies, right-nested: `up_k: inner | inner up_{k-1}`
        for _ in range(hi - lo):
            up_to = (self.helper((inner, inner + up_to) if up_to else (inner,)),)
        return inner * lo + self.optional(up_to)

    def graph(self, graph: ra.Graph) -> str:
        """A right-linear rule per live state: `s_i: <edge> s_j | ... [| nothing, when final]`."""
        key = ("graph", graph)
        hit = self._helpers.get(key)
        if hit is not None:
            return hit
        live = set(graph.finals)
        grew = True
        while grew:  # states that can still reach a final state
            grew = False
            for src, _, dst in graph.edges:
                if dst in live and src not in live:
                    live.add(src)
                    grew = True
        assert 0 in live, "a graph's final states are reachable from its start"
        prefix = self._helpers[key] = f"${len(self._helpers)}_s"
        for state in sorted(live):
            for src, node, dst in graph.edges:
                if src == state and dst in live:
                    self.productions.append((f"{prefix}{state}", self.expand(node) + (f"{prefix}{dst}",)))
            if state in graph.finals:
                self.productions.append((f"{prefix}{state}", ()))
        return f"{prefix}0"


def _min_chars(node: ra.Node) -> int:
    """A lower bound on the characters of every match of a Ref-free node, capped at 2."""
    if isinstance(node, ra.Chars):
        return 1
    if isinstance(node, ra.Seq):
        return min(2, sum(_min_chars(x) for x in node.items))
    if isinstance(node, ra.Alt):
        return min((_min_chars(x) for x in node.items), default=2)
    if isinstance(node, ra.Repeat):
        return min(2, node.min * _min_chars(node.item))
    return 0 if ra.nullable(node) else 1  # a compiled language, a graph: at least one character where not empty


def ref_free_runs(items: tuple[ra.Node, ...], split: Callable[[ra.Node], bool] = lambda _: False) -> list[ra.Node]:
    """Consecutive Ref-free items merged into one piece (one terminal), except those `split` keeps apart."""
    out: list[ra.Node] = []
    run: list[ra.Node] = []
    for item in items:
        if ra.refs(item) or split(item):
            if run:
                out.append(ra.seq(*run))
                run = []
            out.append(item)
        else:
            run.append(item)
    if run:
        out.append(ra.seq(*run))
    return out
