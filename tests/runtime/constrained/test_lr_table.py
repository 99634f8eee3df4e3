"""The direct LALR(1) table builder against Lark's Earley parser (a general CFG parser) on the same grammars."""
from __future__ import annotations

import itertools

import lark
import pytest

from radixlang.runtime.constrained.grammar import lalr
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
    # a rule followed by nullable rules alone at a production's end: its lookahead includes the production's
    "nullable tail": ([("start", ("[", "list", "]")), ("start", ("v",)), ("list", ("start", "rest")),
                       ("rest", ()), ("rest", (",", "start", "rest"))], {"[", "]", ",", "v"}),
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


# Grammars with reduce/reduce conflicts: LALR(1) alone keeps one reading (or none); a forking table follows each.
AMBIGUOUS = {
    "nested ambiguity": ([("start", ("a",)), ("start", ("b",)), ("a", ("(", "a", ")")), ("a", ("x",)),
                          ("b", ("(", "b", ")")), ("b", ("x",)), ("b", ("y",))], {"(", ")", "x", "y"}),
    "empty alike": ([("start", ("{", "o", "}")), ("start", ("{", "p", "}")), ("start", ("[", "start", "]")),
                     ("o", ()), ("o", ("k", "o")), ("p", ()), ("p", ("q",))], {"{", "}", "[", "]", "k", "q"}),
    "lookahead two": ([("start", ("a", "x", "y")), ("start", ("b", "x", "z")), ("a", ("p",)), ("b", ("p",)),
                       ("start", ("(", "start", ")"))], {"x", "y", "z", "p", "(", ")"}),
    "unit cycle": ([("start", ("a",)), ("a", ("b",)), ("a", ("x",)), ("b", ("a",)), ("b", ("y",)),
                    ("b", ("(", "a", ")"))], {"x", "y", "(", ")"}),
}


@pytest.mark.parametrize("name", AMBIGUOUS)
def test_a_forking_table_accepts_exactly_what_a_general_parser_accepts(name):
    productions, terminals = AMBIGUOUS[name]
    with pytest.raises(ValueError, match="reduce/reduce conflict"):
        build_table(productions, terminals)
    table = build_table(productions, terminals, forks=True)
    parser = earley(productions, terminals)
    assert any(kind is lalr.FORK for row in table.actions.values() for kind, _ in row.values())
    accepted = 0
    for n in range(6):
        for symbols in itertools.product(sorted(terminals), repeat=n):
            assert table_accepts(table, symbols) == lark_accepts(parser, symbols), symbols
            accepted += lark_accepts(parser, symbols)
    assert accepted >= 3  # the enumeration reaches real sentences


def test_a_fork_past_its_bound_keeps_its_first_readings_and_never_accepts_more(monkeypatch):
    """`start: r0 "e" "u" | r1 "e" "v" | ...`, each `r_i: "x"`: five readings live after "x" "e"; past
    MAX_FORK_STACKS the later ones are dropped (a text only they read is refused), the earlier ones still read."""
    monkeypatch.setattr(lalr, "MAX_FORK_STACKS", 3)
    ends = "uvwyz"
    productions = [("start", (f"r{i}", "e", end)) for i, end in enumerate(ends)]
    productions += [(f"r{i}", ("x",)) for i in range(len(ends))]
    table = build_table(productions, {"x", "e", *ends}, forks=True)
    fork = table.feed(table.feed(table.initial(), "x"), "e")
    assert len(table.members(fork)) == 3
    assert [table_accepts(table, ("x", "e", end)) for end in ends] == [True, True, True, False, False]


def lark_accepts(parser: lark.Lark, symbols: tuple[str, ...]) -> bool:
    try:
        parser.parse("".join(symbols))
        return True
    except lark.exceptions.LarkError:
        return False


def test_undefined_rule_is_a_value_error():
    with pytest.raises(ValueError, match="'missing' is used but not defined"):
        build_table([("start", ("missing",))], {"x"})
