"""JSON-schema rules -> LALR grammar: long repeats parse in constant stack depth (so masks cache)."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest

from .test_grammar import assert_brute_force


def stack_depth(table, state) -> int:
    stack, depth = state[0], 0
    while stack is not None:
        stack, depth = table.parent(stack), depth + 1
    return depth


def test_a_long_recursive_array_returns_to_the_same_parser_state_after_each_item(compiler):
    schema = {"type": "array", "items": {"$ref": "#"}}  # arrays of arrays (recursive), unbounded
    constraint = compiler.compile("json_schema", schema)
    state = constraint.advance_bytes(constraint.initial(), b"[[]")
    after_items = []
    for _ in range(40):
        state = constraint.advance_bytes(state, b",[]")
        assert state is not None
        after_items.append(state)
    assert len({stack_depth(constraint.table, s) for s in after_items[1:]}) == 1
    assert len(set(after_items[5:])) == 1  # one state, so one cached mask, whatever the length
    done = constraint.advance_bytes(state, b"]")
    assert constraint.can_end(done)
    jsonschema.validate(json.loads("[[]" + ",[]" * 40 + "]"), schema)


def test_a_long_bounded_array_is_counted_by_rules_not_copied_into_one_lexeme(compiler):
    # the shape of JSONSchemaBench's Github_medium o9958: a closed object on the rules' path, whose `ids` (up to
    # 1,000 strings of 24 characters, `\d` being every Unicode digit as in Python's `re`) was one lexeme of
    # 1,000 copies: a DFA past the lexer's bound, met mid-decode. The grammar now counts the copies, and the
    # item is one lexeme
    word = {"type": "string", "pattern": "^[0-9a-zA-Z_-]{1,255}$"}
    tag = {"type": "object", "additionalProperties": False,
           "properties": {"key": word, "value": {"type": "string", "minLength": 1, "maxLength": 255}}}
    schema = {"type": "object", "additionalProperties": False, "properties": {
        **{name: {"type": "number"} for name in ("start", "end", "duration", "resolution")},
        "mode": {"oneOf": [{"type": "string", "enum": ["FIRST", "LAST", "MEAN"]}, {"type": "string", "enum": ["NONE"]}]},
        "names": {"type": "array", "items": word},
        "tags": {"type": "array", "items": tag, "maxItems": 100},
        "ids": {"type": "array", "items": {"type": "string", "pattern": "^[A-Fa-f\\d]{24}$"}, "maxItems": 1000},
        "limit": {"type": "number"}, "order": {"type": "string", "enum": ["asc", "desc"]}}}
    constraint = compiler.compile("json_schema", schema)
    validator = jsonschema.Draft202012Validator(schema)
    for count in (0, 1, 100, 101):
        tags = [{"key": f"k{i}", "value": "v" * (1 + i % 7)} for i in range(count)]
        full = {"start": 1, "end": 2, "duration": 1, "resolution": 60, "mode": "MEAN", "names": ["a", "b"], "tags": tags,
                "ids": ["a" * 24, "b" * 24], "limit": 9, "order": "asc"}
        for doc in (full,
                    {"tags": tags, "ids": ["a" * 23]}, {"tags": tags[:1], "limit": 5}):
            text = json.dumps(doc, separators=(",", ":")).encode()
            state = constraint.advance_bytes(constraint.initial(), text)
            assert (state is not None and constraint.can_end(state)) == validator.is_valid(doc), (count, doc)


NODE = {"$ref": "#/$defs/node"}
# Unions whose alternatives end alike: LALR(1) has two rules to reduce on one lookahead (a refusal before).
CONFLICTS = {
    # a recursive object and an open map of booleans both read `{}` (o42127's kind: `}` reduces either)
    "both read {}": {"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {
        "anyOf": [NODE, {"type": "object", "additionalProperties": {"type": "boolean"}}]}}}}}, "$ref": "#/$defs/node"},
    # two object rules at one place, both reading `{}` and an optional "f" (o48404's kind)
    "objects alike through refs": {"$defs": {
        "a": {"type": "object", "properties": {"f": {"type": "integer"}, "kids": {"type": "array", "items": {"$ref": "#"}}}},
        "b": {"type": "object", "properties": {"f": {"type": "integer"}, "n": {"$ref": "#/$defs/b"}},
              "additionalProperties": False}},
        "type": "object", "properties": {"v": {"anyOf": [{"$ref": "#/$defs/a"}, {"$ref": "#/$defs/b"}, {"type": "null"}]}}},
}
INSTANCES = {
    "both read {}": [{}, {"kids": []}, {"kids": [{}]}, {"kids": [{"x": True}, {"kids": [{}]}]}, {"kids": [{"kids": 1}]},
                     {"kids": [{"x": 1}]}, {"kids": [{"kids": [], "x": True}]},
                     {"kids": [[]]}, {"kids": {}}],
    "objects alike through refs": [{}, {"v": {}}, {"v": {"f": 1}}, {"v": {"f": 1, "n": {}}}, {"v": {"n": {"f": 2}}},
                                   {"v": {"kids": [{"v": {"f": 3}}]}}, {"v": {"f": 1, "kids": [{}]}}, {"v": None},
                                   {"v": {"n": {"kids": []}}}, {"v": {"n": {"z": 1}}}, {"v": {"f": "x"}}, {"v": 3}],
}


@pytest.mark.parametrize("name", CONFLICTS)
def test_unions_that_end_alike_parse_every_way_against_jsonschema(name, compiler, vocab, walk):
    """The parser forks where two rules reduce on one lookahead (lalr.FORK), and a lexeme two terminals match
    (`"n":` as a's free key and b's declared one) is read as each: the schema compiles in its own form, accepts
    exactly what jsonschema accepts, its outputs validate, and the mask where the parse has forked equals
    advancing each token of the vocabulary."""
    schema = CONFLICTS[name]
    constraint = compiler.compile("json_schema", schema)
    assert not any("strict form" in note for note in constraint.unenforced), constraint.unenforced
    valid = 0
    for value in INSTANCES[name]:
        expected = jsonschema.Draft202012Validator(schema).is_valid(value)
        assert accepts(constraint, json.dumps(value, separators=(",", ":"))) == expected, value
        valid += expected
    assert 3 <= valid < len(INSTANCES[name])
    rng = random.Random(0)
    for _ in range(15):
        data, done = walk(constraint, rng, 80)
        if done:
            jsonschema.validate(json.loads(data), schema)
    forks = []
    for value in INSTANCES[name]:
        state = constraint.initial()
        for b in json.dumps(value, separators=(",", ":")).encode():
            state = state and constraint.advance_bytes(state, bytes([b]))
            if state and len(constraint.table.members(state[0])) > 1:
                forks.append(state)
    assert forks, "no parse forked"
    for state in forks[:2]:
        assert_brute_force(constraint, state, constraint.allowed(state), vocab, name)


def accepts(constraint, text: str) -> bool:
    state = constraint.advance_bytes(constraint.initial(), text.encode())
    return state is not None and constraint.can_end(state)
