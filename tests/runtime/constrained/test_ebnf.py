"""SGLang's `ebnf` constraint (XGrammar's EBNF dialect): the compiled constraint against independent
oracles of the same language, written by hand: Lark's Earley parser for a recursive grammar, Python's `re`
for regular ones."""
from __future__ import annotations

import random
import re

import lark
import pytest

from .test_grammar import engine_accepts, lark_accepts

# recursive: arithmetic with parentheses
ARITH_EBNF = r"""
root ::= expr            # the start rule
expr ::= term (("+" | "-") term)*
term ::= factor (("*" | "/") factor)*
factor ::= [0-9]+ | "(" expr ")" | "-" factor
"""
ARITH_LARK = r"""
start: expr
expr: term (("+" | "-") term)*
term: factor (("*" | "/") factor)*
factor: /[0-9]+/ | "(" expr ")" | "-" factor
"""
ARITH_PIECES = ["1", "23", "0", "+", "-", "*", "/", "(", ")", "((", " ", "x"]
# regular (SGLang's documentation example, plus escapes, classes, counted repeats and `.`)
CITY_EBNF = r"""
root ::= city | description
city ::= "London" | "Paris" | "Berlin" | "Rome"
description ::= city " is " status
status ::= "the capital of " country
country ::= "England" | "France" | "Germany" | "Italy"
"""
CITY_RE = r"(London|Paris|Berlin|Rome)( is the capital of (England|France|Germany|Italy))?"
LIST_EBNF = r"""root ::= "[" (str ("," str){0,2})? "]" "\n"?
str ::= "\"" ([^"\\\n] | "\\" ["\\nt])* "\"" | 'x' .{1,2}"""
LIST_RE = r'\[((?:"(?:[^"\\\n]|\\["\\nt])*"|x.{1,2})(?:,(?:"(?:[^"\\\n]|\\["\\nt])*"|x.{1,2})){0,2})?\]\n?'
LIST_PIECES = ["[", "]", ",", '"', "\\", "a", "n", "é", "x", "\n", "\t", "  "]


def random_texts(valid: list[str], pieces: list[str], seed: int) -> list[str]:
    """Random piece strings, and near misses of each valid string (a piece inserted, deleted, replaced)."""
    rng = random.Random(seed)
    texts = ["".join(rng.choice(pieces) for _ in range(rng.randint(1, 8))) for _ in range(400)]
    for text in valid:
        for _ in range(6):
            i, piece = rng.randrange(len(text) + 1), rng.choice(pieces)
            texts.append(rng.choice([text[:i] + piece + text[i:], text[:i] + text[i + 1:],
                                     text[:i] + piece + text[i + 1:]]))
    return texts


def walks(constraint, walk, seed: int, count: int = 30) -> list[str]:
    rng = random.Random(seed)
    return [data.decode() for data, done in (walk(constraint, rng, 60) for _ in range(count)) if done]


def test_a_recursive_grammar_accepts_what_larks_earley_parser_accepts(compiler, walk):
    constraint = compiler.compile("ebnf", ARITH_EBNF)
    parser = lark.Lark(ARITH_LARK, parser="earley")
    valid = walks(constraint, walk, 1)
    assert len(valid) >= 10 and any("(" in v for v in valid)
    for text in valid:  # every complete output parses
        parser.parse(text)
    accepted = 0
    for text in random_texts(valid, ARITH_PIECES, 2):
        expected = lark_accepts(parser, text)
        assert engine_accepts(constraint, text) == expected, text
        accepted += expected
    assert accepted > 40


def test_an_ambiguous_recursive_grammar_reads_every_way_it_parses(compiler, walk):
    """`a` and `b` both read "(x)": a reduce/reduce conflict at each ")" that the parser forks on; its
    language is (^n x|y )^n, which Earley (a general parser) reads too."""
    grammar = 'root ::= a | b\na ::= "(" a ")" | "x"\nb ::= "(" b ")" | "x" | "y"'
    constraint = compiler.compile("ebnf", grammar)
    parser = lark.Lark('start: a | b\na: "(" a ")" | "x"\nb: "(" b ")" | "x" | "y"', parser="earley")
    valid = walks(constraint, walk, 5)
    assert len(valid) >= 10 and any(v.startswith("((") for v in valid)
    for text in random_texts(valid + ["((x))", "(((y)))"], ["(", ")", "x", "y"], 6):
        assert engine_accepts(constraint, text) == lark_accepts(parser, text), text


@pytest.mark.parametrize("ebnf, pattern, pieces", [(CITY_EBNF, CITY_RE, ["Paris", " is ", "the capital of ",
                                                                         "France", "Rome", "x", " "]),
                                                    (LIST_EBNF, LIST_RE, LIST_PIECES)])
def test_a_regular_grammar_accepts_what_its_regex_accepts(ebnf, pattern, pieces, compiler, walk):
    constraint = compiler.compile("ebnf", ebnf)
    valid = walks(constraint, walk, 3)
    assert len(valid) >= 10
    for text in valid:
        assert re.fullmatch(pattern, text, re.DOTALL), text
    for text in random_texts(valid, pieces, 4):
        assert engine_accepts(constraint, text) == bool(re.fullmatch(pattern, text, re.DOTALL)), text


def test_a_regular_grammar_compiles_to_one_automaton_and_a_recursive_one_to_a_parser(compiler):
    from radixlang.runtime.constrained.grammar.constraint import GrammarConstraint
    from radixlang.runtime.constrained.matcher import RegexConstraint

    assert isinstance(compiler.compile("ebnf", CITY_EBNF), RegexConstraint)
    assert isinstance(compiler.compile("ebnf", ARITH_EBNF), GrammarConstraint)


@pytest.mark.parametrize("grammar, message", [
    ("", "the grammar is empty"),
    ('city ::= "a"', "has no `root` rule"),
    ('root ::= "a" item', "undefined rule(s) ['item']"),
    ('root ::= "a', "unterminated string at line 1"),
    ('root ::= "a"\nroot ::= "b"', "rule `root` is defined twice at line 2"),
    ('root ::= [z-a]', "reversed"),
    ('root ::= "a"{2,1}', "needs m <= n"),
    ('root ::= "a" (= "b")', "lookahead assertions"),
    ('root ::= TagDispatch("a")', "built-in macros"),
    ('root = "a"', "expected `::=`"),
    ('root ::= "a" | )', "unexpected ')'"),
    ('root ::= "\\u12"', "hex digits"),
    ("root ::= " + "(" * 5000 + '"a"' + ")" * 5000, "nests too deeply"),
])
def test_bad_grammars_raise_value_errors_naming_the_field(grammar, message, compiler):
    with pytest.raises(ValueError, match="^ebnf") as e:
        compiler.compile("ebnf", grammar)
    assert message in str(e.value)
