"""The direct LALR(1) table builder against Lark's Earley parser (a general CFG parser) on the same grammars."""
from __future__ import annotations

import itertools

import lark
import pytest

from radixlang.runtime.constrained.grammar.lr_table import build_table

# (productions, terminals); every terminal is one character, so Earley parses the same strings.
GRAMMARS = {
    "nested lists": ([("start", ("[", "$items", "]")), ("$items", ()), ("$items", ("$many",)),
                      ("$many", ("v",)), ("$many", ("start",)), ("$many", ("$many", ",", "v")),
                      ("$many", ("$many", ",", "start"))], {"[", "]", ",", "v"}),
    "arithmetic": ([("start", ("e",)), ("e", ("e", "+", "t")), ("e", ("t",)), ("t", ("t", "*", "f")), ("t", ("f",)),
                    ("f", ("(", "e", ")")), ("f", ("n",))], {"+", "*", "(", ")", "n"}),
    "nullable rules": ([("start", ("a", "b", "c")), ("a", ()), ("a", ("x",)), ("b", ()), ("b", ("y", "b")),
                        ("c", ("z",)), ("c", ("w", "b", "x"))], {"w", "x", "y", "z"}),
    "object graph": ([("start", ("{", "s0")), ("s0", ("k", "s1")), ("s0", ("}",)), ("s1", (",", "k", "s2")),
                      ("s1", ("}",)), ("s2", ("}",)), ("k", ("q", "start")), ("k", ("q", "n"))],
                     {"{", "}", ",", "q", "n"}),
}


def table_accepts(table, symbols: tuple[str, ...]) -> bool:
    stack = table.initial()
    for sym in symbols:
        stack = table.feed(stack, sym)
        if stack is None:
            return False
    return table.accepts_end(stack)


def earley(productions, terminals) -> lark.Lark:
    names = {t: f"T{i}" for i, t in enumerate(sorted(terminals))}
    rule = {r: "r" + "".join(c if c.isalnum() else "_" for c in r) for r, _ in productions}
    rule["start"] = "start"
    alts: dict[str, list[str]] = {}
    for r, rhs in productions:
        alts.setdefault(rule[r], []).append(" ".join(names.get(s) or rule[s] for s in rhs))
    lines = [f"{r}: " + " | ".join(a) for r, a in alts.items()]
    lines += [f'{name}: "{t}"' for t, name in names.items()]
    return lark.Lark("\n".join(lines), parser="earley", lexer="basic")


@pytest.mark.parametrize("name", GRAMMARS)
def test_table_accepts_exactly_the_strings_a_general_parser_accepts(name):
    productions, terminals = GRAMMARS[name]
    table = build_table(productions, terminals)
    parser = earley(productions, terminals)
    accepted = 0
    for n in range(7):
        for symbols in itertools.product(sorted(terminals), repeat=n):
            try:
                parser.parse("".join(symbols))
                expected = True
            except lark.exceptions.LarkError:
                expected = False
            assert table_accepts(table, symbols) == expected, symbols
            accepted += expected
    assert accepted >= 3  # the enumeration reaches real sentences


def test_reduce_reduce_conflict_is_a_value_error():
    productions = [("start", ("a",)), ("start", ("b",)), ("a", ("x",)), ("b", ("x",))]
    with pytest.raises(ValueError, match="reduce/reduce conflict"):
        build_table(productions, {"x"})


def test_undefined_rule_is_a_value_error():
    with pytest.raises(ValueError, match="'missing' is used but not defined"):
        build_table([("start", ("missing",))], {"x"})
