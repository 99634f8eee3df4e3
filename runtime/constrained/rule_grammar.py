"""Rules of regex trees with `Ref`s (recursive JSON schemas) -> a Lark grammar for the LALR engine.

Every maximal Ref-free piece becomes one terminal, so lexemes stay large (few parser steps) and the
terminal's exact language is handed to the engine directly; Lark only sees placeholder patterns and
builds the LALR table.
"""
from __future__ import annotations

from . import regex_ast as ra
from .lalr import LarkGrammar, build_lark


def rules_to_lark(root: ra.Node, rules: dict[str, ra.Node]) -> LarkGrammar:
    writer = _Writer()
    lines = [f"start: {writer.expand(root)}"]
    lines += [f"{name}: {writer.expand(body)}" for name, body in rules.items()]
    lines += writer.optionals
    lines += [f'{name}: "<{name}>"' for name in writer.terminals.values()]
    try:
        return build_lark("\n".join(lines), {name: node for node, name in writer.terminals.items()})
    except ValueError as e:
        raise ValueError(f"json_schema: its recursive part has no unambiguous LALR(1) grammar ({e})") from None


class _Writer:
    def __init__(self) -> None:
        self.terminals: dict[ra.Node, str] = {}
        self.optionals: list[str] = []  # helper rules: `opt_k: x?`, and a graph's states
        self.graphs = 0

    def optional(self, body: str) -> str:
        """A rule for `body` or nothing. Lark expands each `[x]` in a rule into two alternatives of
        that rule, so a rule with many inline optionals (an object's members) grows exponentially."""
        name = f"opt_{len(self.optionals)}"
        self.optionals.append(f"{name}: ({body})?")
        return name

    def terminal(self, node: ra.Node) -> str:
        if node not in self.terminals:
            self.terminals[node] = f"T{len(self.terminals)}"
        return self.terminals[node]

    def graph(self, graph: ra.Graph) -> str:
        """A right-linear rule per live state: `s_i: <edge> s_j | ... [| nothing, when final]`."""
        live = set(graph.finals)
        grew = True
        while grew:  # states that can still reach a final state
            grew = False
            for src, _, dst in graph.edges:
                if dst in live and src not in live:
                    live.add(src)
                    grew = True
        prefix = f"graph{self.graphs}"
        self.graphs += 1
        for state in sorted(live):
            alts = [" ".join(p for p in (self.expand(n), f"{prefix}_s{dst}") if p)
                    for src, n, dst in graph.edges if src == state and dst in live]
            body = " | ".join(f"({a})" for a in alts)
            if state in graph.finals:
                body = self.optional(body) if alts else ""
            self.optionals.append(f"{prefix}_s{state}: {body}")
        assert 0 in live, "a graph's final states are reachable from its start"
        return f"{prefix}_s0"

    def expand(self, node: ra.Node) -> str:
        """Lark expansion text for `node` ('' when it matches only the empty string)."""
        if not ra.refs(node):
            if node == ra.EMPTY:
                return ""
            name = self.terminal(node)  # the engine builds terminals without their empty match
            return self.optional(name) if ra.nullable(node) else name
        if isinstance(node, ra.Ref):
            return node.name
        if isinstance(node, ra.Graph):
            return self.graph(node)
        if isinstance(node, ra.Seq):
            return " ".join(p for p in (self.expand(g) for g in _groups(node.items)) if p)
        if isinstance(node, ra.Alt):
            parts = [self.expand(x) for x in node.items]
            body = " | ".join(p for p in parts if p)
            return self.optional(body) if "" in parts else f"({body})"
        assert isinstance(node, ra.Repeat), f"unexpected node {node!r} around a rule reference"
        inner = self.expand(node.item)
        lo, hi = node.min, node.max
        if hi is None:
            return f"({inner})*" if lo == 0 else f"({inner})+" if lo == 1 else f"({inner}) ~ {lo} ({inner})*"
        if (lo, hi) == (0, 1):
            return self.optional(inner)
        if lo == 0:
            return self.optional(f"({inner}) ~ 1..{hi}")
        return f"({inner}) ~ {lo}" if lo == hi else f"({inner}) ~ {lo}..{hi}"


def _groups(items: tuple[ra.Node, ...]) -> list[ra.Node]:
    """Consecutive Ref-free items merged into one piece (one terminal)."""
    out: list[ra.Node] = []
    run: list[ra.Node] = []
    for item in items:
        if ra.refs(item):
            if run:
                out.append(ra.seq(*run))
                run = []
            out.append(item)
        else:
            run.append(item)
    if run:
        out.append(ra.seq(*run))
    return out
