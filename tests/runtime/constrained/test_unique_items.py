"""uniqueItems on any item schema (unique_items.py, jsonschema/unique_walk.py), with the `jsonschema` library
as the oracle: repeated items refused, distinct ones accepted; masks agree with advance token by token; a
random walk never meets a state with no way to finish."""
from __future__ import annotations

import json
import random

import jsonschema
import numpy as np
import pytest

from radixlang.runtime.constrained.compiler import ConstraintCompiler, unenforced
from radixlang.runtime.constrained.unique_items import UniqueItems

STRINGS = {"type": "array", "items": {"type": "string"}, "uniqueItems": True}
CASES = [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True},
     ["[1,2]", "[1,1]", "[1,10]", "[10,1]", "[]", "[1,2,1]", "[-1,1]"]),
    ({"type": "array", "uniqueItems": True},  # any items: values compared as JSON
     ["[1,1.0]", "[1,true]", "[0,false]", "[null,null]", "[1e2,100]", '["a","b"]', '["a","a"]', '["\\u0061","a"]',
      '[{"a":1,"b":2},{"b":2,"a":1}]', '[{"a":1},{"a":2}]', "[[1],[1.0]]", "[[1,2],[2,1]]"]),
    ({"type": "object", "properties": {"t": {"$ref": "#/$defs/tags"}}, "$defs": {"tags": STRINGS}},
     ['{"t":["x","y"]}', '{"t":["x","x"]}', '{"t":[],"u":["x","x"]}']),
    ({"anyOf": [STRINGS, {"type": "integer"}]}, ['["a","a"]', '["a","b"]', "3"]),
    ({"type": "array", "items": STRINGS},  # nested: the inner arrays only
     ['[["a"],["a"]]', '[["a","a"]]', '[["a","b"],["b","a"]]']),
    ({"type": "array", "items": {"type": "array"}, "uniqueItems": True}, ['[[],[]]', '[[1,[2]],[1,[2.0]]]', '[[1],[]]']),
    ({"type": "array", "prefixItems": [{"type": "integer"}], "items": {"type": "string"}, "uniqueItems": True},
     ['[1,"1"]', '[1,"a","a"]']),
    # then and else both ask it: held whichever `if` picks
    ({"type": "object", "if": {"properties": {"k": {"const": "x"}}, "required": ["k"]},
      "then": {"properties": {"a": STRINGS}}, "else": {"properties": {"a": STRINGS, "b": {"type": "null"}}}},
     ['{"k":"x","a":["p","p"]}', '{"a":["p","p"]}', '{"a":["p","q"]}', '{"k":"x","a":["p","q"]}']),
]


@pytest.fixture(scope="module")
def unique_compiler(vocab) -> ConstraintCompiler:
    return ConstraintCompiler(lambda: vocab, json_relaxed="oneOf")


def _accepts(constraint, text: str) -> bool:
    state = constraint.advance_bytes(constraint.initial(), text.encode())
    return state is not None and constraint.can_end(state)


@pytest.mark.parametrize("schema, instances", CASES)
def test_repeated_items_are_refused_as_jsonschema_says(unique_compiler, schema, instances):
    constraint = unique_compiler.compile("json_schema", schema)
    assert isinstance(constraint, UniqueItems) and unenforced(constraint) == ()
    validator = jsonschema.Draft202012Validator(schema)
    for text in instances:
        assert _accepts(constraint, text) == validator.is_valid(json.loads(text)), text


def test_a_union_that_leaves_it_open_is_reported_and_relaxing_it_drops_the_scan(vocab, unique_compiler):
    open_union = {"anyOf": [STRINGS, {"type": "array", "items": {"type": "integer"}}]}
    constraint = unique_compiler.compile("json_schema", open_union)
    assert unenforced(constraint) == ("uniqueItems at #/anyOf/0",)
    assert _accepts(constraint, "[1,1]")  # valid: the second branch
    relaxed = ConstraintCompiler(lambda: vocab, json_relaxed="uniqueItems").compile("json_schema", STRINGS)
    assert not isinstance(relaxed, UniqueItems) and unenforced(relaxed) == ("uniqueItems at #",)


def test_a_condition_that_leaves_it_open_is_reported(unique_compiler):
    """`then` alone, or a dependent schema, asks distinct items under a condition the scan does not judge: reported
    (JSONSchemaBench's anywork-ac-1.1 accepted a repeat with nothing reported), and enforced where it also holds
    unconditionally."""
    then_only = {"type": "object", "if": {"properties": {"k": {"const": "x"}}, "required": ["k"]},
                 "then": {"properties": {"a": STRINGS}}}
    constraint = unique_compiler.compile("json_schema", then_only)
    assert unenforced(constraint) == ("uniqueItems at #/then/properties/a",)
    assert _accepts(constraint, '{"a":["p","p"]}')  # valid: `if` fails, no demand
    dependent = {"type": "object", "properties": {"k": {"type": "null"}}, "dependentSchemas": {"k": {"properties": {
        "a": STRINGS}}}}
    assert unenforced(unique_compiler.compile("json_schema", dependent)) == \
        ("uniqueItems at #/dependentSchemas/k/properties/a",)
    both = {**then_only, "properties": {"a": STRINGS}}
    constraint = unique_compiler.compile("json_schema", both)
    assert isinstance(constraint, UniqueItems) and unenforced(constraint) == ()
    assert not _accepts(constraint, '{"a":["p","p"]}') and _accepts(constraint, '{"a":["p","q"]}')


def test_masks_agree_with_advance_on_every_token(unique_compiler, vocab):
    """At states inside arrays of distinct items (a string item open, between items, an enum item begun),
    the mask allows exactly the tokens advance accepts (brute force over the vocabulary)."""
    enum = {"type": "array", "items": {"enum": [f"v{i}" for i in range(10)] + [10, 100]}, "uniqueItems": True}
    for schema, prefix, vetoes in [(STRINGS, '["ab","ab', True), (STRINGS, '["ab",', False),
                                   (enum, '["v1",10,"v', True), (enum, "[10,100,1", True)]:
        constraint = unique_compiler.compile("json_schema", schema)
        state = constraint.advance_bytes(constraint.initial(), prefix.encode())
        allowed = constraint.allowed(state)
        inner = constraint.inner.allowed(state[0])
        advances = np.array([bool(inner[t]) and constraint.advance(state, t) is not None for t in range(vocab.size)])
        assert (allowed == advances).all(), (prefix, np.flatnonzero(allowed != advances)[:5])
        assert (inner & ~allowed).any() == vetoes, prefix  # a repeat's last byte, or an enum's dead end


@pytest.mark.parametrize("schema", [
    {"type": "array", "items": {"enum": list("abcdefghij")}, "uniqueItems": True, "minItems": 2},
    {"type": "array", "items": {"enum": [1, 10, 100, 2, 20, 3, 30, 4, 40]}, "uniqueItems": True},
    {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 11}, "uniqueItems": True},
])
def test_random_walks_never_reach_a_dead_end_and_end_valid(unique_compiler, vocab, schema):
    """Walks biased to add items (so an enum runs out of values): every state has a way to finish, and
    every finished output is valid."""
    constraint = unique_compiler.compile("json_schema", schema)
    validator, rng, finished = jsonschema.Draft202012Validator(schema), random.Random(0), 0
    for _ in range(15):
        state, out = constraint.initial(), b""
        for _ in range(120):
            allowed = constraint.allowed(state)
            assert allowed.any() or constraint.can_end(state), f"dead end after {out!r}"
            if constraint.can_end(state) and (not allowed.any() or rng.random() < 0.02):
                break
            ids = np.flatnonzero(allowed).tolist()
            commas = [t for t in ids if vocab.bytes_of(t) == b","]
            t = commas[0] if commas and rng.random() < 0.6 else ids[rng.randrange(len(ids))]
            state = constraint.advance(state, t)
            assert state is not None
            out += vocab.bytes_of(t)
        if constraint.can_end(state):
            finished += 1
            assert validator.is_valid(json.loads(out)), out
    assert finished >= 10


def test_a_token_leaving_a_string_opens_an_array_of_distinct_items(vocab):
    """Inside a string outside any array of distinct items, a token that closes it, opens one and repeats an
    item in it (added to the vocabulary) is refused, and the mask allows exactly what advance accepts there
    (brute force over the vocabulary): the in-string class of tokens that may open such an array is not empty."""
    from radixlang.runtime.constrained.masks.vocab import TokenVocab

    extra = [b'",["a","a"', b'",["a","b"', b'",["a"']
    grown = TokenVocab.create([*vocab.token_bytes, *extra], set(vocab.special_ids), vocab.end_ids,
                              vocab.size + len(extra))
    schema = {"type": "array", "items": {"anyOf": [{"type": "string"}, STRINGS]}}
    constraint = ConstraintCompiler(lambda: grown).compile("json_schema", schema)
    assert isinstance(constraint, UniqueItems)
    state = constraint.advance_bytes(constraint.initial(), b'["x')
    allowed, inner = constraint.allowed(state), constraint.inner.allowed(state[0])
    ids = np.flatnonzero(inner)
    advances = np.zeros(grown.size, bool)
    advances[ids] = [constraint.advance(state, t) is not None for t in ids.tolist()]
    assert (allowed == advances).all(), np.flatnonzero(allowed != advances)[:5]
    repeat, distinct = vocab.size, vocab.size + 1
    assert inner[repeat] and not allowed[repeat] and allowed[distinct]
