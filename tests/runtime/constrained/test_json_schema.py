"""JSON schema -> grammar: every complete output validates (jsonschema); bounds match brute force."""
from __future__ import annotations

import json
import random
import re
from typing import Literal, Optional

import jsonschema
import pydantic
import pytest

from radixlang.runtime.constrained.grammar.constraint import GrammarConstraint
from radixlang.runtime.constrained.jsonschema.json_scalars import integer_node, number_node
from radixlang.runtime.constrained.jsonschema.json_schema import compile_json_schema
from radixlang.runtime.constrained.matcher import RegexConstraint
from radixlang.runtime.constrained.regex.automaton import compile_dfa

CHECKER = jsonschema.FormatChecker()

PERSON = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 12},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "email": {"type": "string", "format": "email"},
        "born": {"type": "string", "format": "date"},
        "id": {"type": "string", "format": "uuid"},
        "score": {"type": "number", "minimum": -5, "exclusiveMaximum": 5.5},
        "tags": {"type": "array", "items": {"type": "string", "maxLength": 4}, "minItems": 1, "maxItems": 3},
        "kind": {"enum": ["a", "b", 3, None, {"x": [1]}]},
        "code": {"type": "string", "pattern": "^[A-Z]{2}-[0-9]{3}$"},
        "flag": {"const": True},
        "maybe": {"anyOf": [{"type": "integer", "maximum": -7}, {"type": "null"}]},
        "pair": {"type": "array", "prefixItems": [{"type": "boolean"}, {"type": "integer", "minimum": 3, "maximum": 4}],
                 "items": False},
    },
    "required": ["name", "age", "id"],
    "additionalProperties": False,  # open, random walks write undeclared keys first: random strings rarely close
}
TREE = {
    "$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "kids": {"type": "array", "items": {"$ref": "#/$defs/node"}, "maxItems": 2},
    }, "required": ["v", "kids"], "additionalProperties": False}},  # open, random walks nest any JSON too deep
    "$ref": "#/$defs/node",
}
ONE_OF = {"oneOf": [
    {"type": "object", "properties": {"t": {"const": "circle"}, "r": {"type": "integer", "minimum": 1, "maximum": 9}},
     "required": ["t", "r"], "additionalProperties": False},
    {"type": "object", "properties": {"t": {"const": "square"}, "side": {"type": "number", "minimum": 0, "maximum": 3}},
     "required": ["t", "side"], "additionalProperties": False},
]}
ANY_META = {"type": "object", "properties": {"k": {"type": "string", "maxLength": 3}, "meta": {}}, "required": ["k", "meta"],
            "additionalProperties": False}
DICT = {"type": "object", "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 99}}


def complete_outputs(constraint, walk, seed: int, wanted: int = 12, max_tokens: int = 200) -> list[str]:
    rng, outs = random.Random(seed), []
    for _ in range(wanted * 8):
        data, done = walk(constraint, rng, max_tokens)
        if done:
            outs.append(data.decode())
        if len(outs) == wanted:
            break
    assert len(outs) >= wanted // 2, "random walks should complete often"
    return outs


@pytest.mark.parametrize("name, schema", [("person", PERSON), ("tree", TREE), ("one_of", ONE_OF),
                                          ("any_meta", ANY_META), ("dict", DICT)])
def test_every_complete_output_validates(name, schema, compiler, walk):
    constraint = compiler.compile("json_schema", schema)
    for text in complete_outputs(constraint, walk, seed=len(name)):
        jsonschema.validate(json.loads(text), schema, format_checker=CHECKER)


def test_regular_schemas_compile_to_a_regex_and_recursive_ones_to_a_grammar(compiler):
    assert isinstance(compiler.compile("json_schema", PERSON), RegexConstraint)
    assert isinstance(compiler.compile("json_schema", TREE), GrammarConstraint)
    assert isinstance(compiler.compile("json_schema", ANY_META), GrammarConstraint)


def test_required_properties_are_always_present_and_in_order_in_the_strict_form(compiler, walk):
    constraint = compiler.compile("json_schema_strict", PERSON)
    for text in complete_outputs(constraint, walk, seed=3):
        keys = list(json.loads(text))
        assert {"name", "age", "id"} <= set(keys)
        assert keys == [k for k in PERSON["properties"] if k in keys]


def test_array_lengths_respect_min_and_max_items(compiler, walk):
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "minItems": 2, "maxItems": 4}
    lengths = {len(json.loads(t)) for t in complete_outputs(compiler.compile("json_schema", schema), walk, 5, 30)}
    assert lengths <= {2, 3, 4} and len(lengths) >= 2


def regex_accepts(node, text: str) -> bool:
    dfa = compile_dfa([node])
    state = dfa.walk(dfa.start, text.encode())
    return state >= 0 and bool(dfa.accept[state] >= 0)


@pytest.mark.parametrize("lo, hi", [(0, 0), (7, 123), (-45, 9), (-300, -12), (None, 15), (98, None), (None, None)])
def test_integer_ranges_match_brute_force(lo, hi):
    dfa = compile_dfa([integer_node(lo, hi)])
    for n in range(-400, 400):
        state = dfa.walk(dfa.start, str(n).encode())
        expected = (lo is None or n >= lo) and (hi is None or n <= hi)
        assert (state >= 0 and dfa.accept[state] >= 0) == expected, n
    for bad in ("-0", "007", "+1", "1.0", ""):
        state = dfa.walk(dfa.start, bad.encode())
        assert not (state >= 0 and dfa.accept[state] >= 0)


@pytest.mark.parametrize("lo, hi", [(0, 2147483647), (-9223372036854775807, 9223372036854775807),
                                   (1000000000000000, 999999999999999999)])
def test_wide_integer_ranges_match_brute_force_near_their_bounds(lo, hi):
    """Ranges as wide as int32 / int64 (real schemas use them): exact at and around every power of ten
    and both bounds."""
    dfa = compile_dfa([integer_node(lo, hi)])
    rng = random.Random(lo)
    probes = [b + d for b in (lo, hi, 0) for d in (-2, -1, 0, 1, 2)]
    probes += [s * (10 ** k + d) for k in range(20) for d in (-1, 0, 1) for s in (1, -1)]
    probes += [rng.randint(lo, hi) for _ in range(200)]
    for n in probes:
        state = dfa.walk(dfa.start, str(n).encode())
        assert (state >= 0 and dfa.accept[state] >= 0) == (lo <= n <= hi), n


@pytest.mark.parametrize("lo, hi", [(0, 10), (-3, 2), (None, -2), (5, None)])
def test_number_bounds_accept_only_numbers_inside(lo, hi):
    dfa = compile_dfa([number_node(lo, hi)])
    rng = random.Random(0)
    samples = ["0", "-0", "10.0", "10.5", "9.999", "-3.0", "-3.01", "2.0", "2.1", "-2", "-1.5", "5", "4.9", "1e3"]
    samples += [f"{rng.uniform(-12, 12):.{rng.randint(0, 3)}f}" for _ in range(400)]
    for text in samples:
        state = dfa.walk(dfa.start, text.encode())
        if state >= 0 and dfa.accept[state] >= 0:
            value = float(text)
            assert (lo is None or value >= lo) and (hi is None or value <= hi), text
            assert re.fullmatch(r"-?(0|[1-9][0-9]*)(\.[0-9]+)?", text)


def test_pydantic_model_class_is_accepted(compiler, walk):
    class Pet(pydantic.BaseModel):  # closed: random undeclared keys, allowed anywhere, would rarely close
        model_config = pydantic.ConfigDict(extra="forbid")
        kind: Literal["cat", "dog"]
        age: int = pydantic.Field(ge=0, le=30)

    class Owner(pydantic.BaseModel):
        model_config = pydantic.ConfigDict(extra="forbid")
        name: str = pydantic.Field(max_length=8)
        pets: list[Pet] = pydantic.Field(max_length=2)
        nick: Optional[str] = pydantic.Field(default=None, max_length=4)

    constraint = compiler.compile("json_schema", Owner)
    for text in complete_outputs(constraint, walk, seed=9):
        Owner.model_validate_json(text)


def test_whitespace_policy_is_compact_by_default_and_configurable():
    schema = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 5},
                                               "b": {"type": "array", "items": {"type": "boolean"}, "maxItems": 2}},
              "required": ["a", "b"]}
    compact = compile_json_schema(schema)
    assert regex_accepts(compact.root, '{"a":1,"b":[true]}')
    assert not regex_accepts(compact.root, '{"a": 1,"b":[true]}')
    spaced = compile_json_schema(schema, whitespace=r"[ \n]{0,2}")
    assert regex_accepts(spaced.root, '{ "a" : 1,\n "b":[ true ] }')
    assert not regex_accepts(spaced.root, '{"a":   1,"b":[]}')


@pytest.mark.parametrize("pattern", [r"[ ]*", r"\s+", "x?"])
def test_unbounded_or_non_blank_whitespace_patterns_are_rejected(pattern):
    with pytest.raises(ValueError, match="whitespace pattern"):
        compile_json_schema({"type": "integer"}, whitespace=pattern)


@pytest.mark.parametrize("schema, keyword", [
    ({"type": "array", "contains": {"type": "integer"}}, "contains"),
    ({"type": "number", "multipleOf": 0.3}, "multipleOf"),
    ({"not": {"type": "string", "minLength": 2}}, "not"),  # `not` with a pattern is supported: see not_pattern
    ({"$ref": "http://example.com/x.json"}, "no document is fetched"),
    ({"$ref": "#/$defs/missing"}, "does not resolve"),
    ({"type": "strin"}, "type"),
    ({"type": "integer", "minimum": 5, "maximum": 1}, "no integer"),
    ({"type": "integer", "minimum": "5"}, "minimum"),
    ({"allOf": [{"type": "string"}, {"type": "integer"}]}, "no common type"),
    ({"type": "string", "anyOf": [{"type": "integer"}]}, "no value can satisfy"),
    ("{not json", "not valid JSON"),
    (42, "must be a dict"),
])
def test_unsupported_or_malformed_schemas_raise_value_errors_naming_the_problem(schema, keyword, compiler):
    with pytest.raises(ValueError, match=re.escape(keyword)):
        compiler.compile("json_schema", schema)


def test_keywords_beside_any_of_apply_to_every_branch():
    root = compile_json_schema({"type": "string", "anyOf": [{"type": "string", "format": "date"},
                                                             {"maxLength": 2}]}).root
    assert regex_accepts(root, '"2024-02-28"') and regex_accepts(root, '"ab"')
    assert not regex_accepts(root, '"abc"') and not regex_accepts(root, "12")


def test_one_of_excludes_values_that_match_several_branches(compiler, walk):
    schema = {"oneOf": [{"type": "integer", "minimum": 0, "maximum": 20}, {"type": "integer", "minimum": 10, "maximum": 30},
                        {"enum": ["x", 15]}]}
    root = compile_json_schema(schema).root
    for n in range(-5, 40):
        matches = (0 <= n <= 20) + (10 <= n <= 30) + (n == 15)
        assert regex_accepts(root, str(n)) == (matches == 1), n
    assert regex_accepts(root, '"x"')
    for text in complete_outputs(compiler.compile("json_schema", schema), walk, seed=1):
        jsonschema.validate(json.loads(text), schema)
    with pytest.raises(ValueError, match="exactly one"):
        compile_json_schema({"oneOf": [{"const": 1}, {"enum": [1]}]})


def test_string_pattern_uses_search_semantics_unless_anchored():
    schema = {"type": "object", "properties": {"s": {"type": "string", "pattern": "[0-9]"},
                                               "t": {"type": "string", "pattern": "^a"},
                                               "u": {"type": "string", "pattern": "b$"}}, "required": ["s", "t", "u"]}
    root = compile_json_schema(schema).root
    for s_, t, u in [("1", "a", "b"), ("x9y", "abc", "cab"), ("é5", "a b", " b")]:
        text = json.dumps({"s": s_, "t": t, "u": u}, ensure_ascii=False, separators=(",", ":"))
        assert regex_accepts(root, text), text
    for s_, t, u in [("x", "a", "b"), ("1", "ba", "b"), ("1", "a", "bc"), ('1"', "a", "b")]:
        text = json.dumps({"s": s_, "t": t, "u": u}, ensure_ascii=False, separators=(",", ":"))
        assert not regex_accepts(root, text), text
