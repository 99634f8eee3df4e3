"""JSON Schema keywords beyond the basics, with `jsonschema` as the oracle: every output the constraint
completes validates, and every mutant of an output that the constraint accepts validates too (no
false accepts). Each schema is a minimal one of a shape that real-world schemas use."""
from __future__ import annotations

import itertools
import json
import random
from decimal import Decimal

import jsonschema
import pytest

from radixlang.runtime.constrained.compiler import ConstraintCompiler, unenforced
from radixlang.runtime.constrained.jsonschema.json_scalars import number_node
from radixlang.runtime.constrained.jsonschema.json_schema import compile_json_schema
from radixlang.runtime.constrained.regex.automaton import compile_dfa

from .test_json_schema import complete_outputs

DRAFT4 = "http://json-schema.org/draft-04/schema#"

KEYWORD_SCHEMAS = {
    "pattern_properties": {"type": "object", "properties": {"id": {"type": "integer", "minimum": 0, "maximum": 9}},
                           "patternProperties": {"^x-[a-z]{1,3}$": {"type": "boolean"}},
                           "additionalProperties": False, "required": ["id"]},
    "additional_properties_schema": {"type": "object", "properties": {"a": {"type": "null"}},
                                     "additionalProperties": {"type": "integer", "minimum": 1, "maximum": 3}},
    "min_max_properties": {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "boolean"},
                                                             "c": {"type": "integer", "minimum": 0, "maximum": 5}},
                           "minProperties": 2, "maxProperties": 2},
    "min_properties_map": {"type": "object", "additionalProperties": {"type": "boolean"}, "minProperties": 1,
                           "maxProperties": 3},
    "dependencies_draft4": {"$schema": DRAFT4, "type": "object", "properties": {"card": {"type": "integer", "minimum": 0, "maximum": 9},
                                                              "billing": {"type": "string", "maxLength": 3}},
                            "dependencies": {"card": ["billing"]}},
    "dependent_schemas": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 9},
                                                            "b": {"type": "integer", "minimum": 0, "maximum": 9}},
                          "dependentSchemas": {"a": {"properties": {"b": {"minimum": 5}}, "required": ["b"]}}},
    "all_of_several": {"allOf": [{"type": "object", "properties": {"a": {"type": "integer", "minimum": 0}},
                                  "required": ["a"]},
                                 {"properties": {"a": {"maximum": 20}, "b": {"type": "string", "maxLength": 2}}},
                                 {"properties": {"a": {"multipleOf": 4}}}]},
    "ref_with_siblings": {"$defs": {"n": {"type": "integer", "minimum": 0, "maximum": 50}},
                          "$ref": "#/$defs/n", "maximum": 10, "description": "at most ten"},
    "draft4_id_refs": {"$schema": DRAFT4, "id": "http://example.com/root.json", "definitions": {"s": {"id": "#short", "type": "string",
                                                                                   "maxLength": 2}},
                       "type": "array", "items": [{"$ref": "#short"}, {"$ref": "root.json#/definitions/s"}],
                       "additionalItems": False},
    "keyword_beside_and_inside_any_of": {"type": "object", "properties": {"k": {"type": "integer"}},
                                         "anyOf": [{"properties": {"k": {"minimum": 5, "maximum": 6}}, "required": ["k"]},
                                                   {"properties": {"k": {"maximum": -3, "minimum": -4}}}]},
    "if_then_else": {"type": "object", "properties": {"kind": {"enum": ["a", "b"]}, "n": {"type": "integer"}},
                     "required": ["kind", "n"],
                     "if": {"properties": {"kind": {"const": "a"}}},
                     "then": {"properties": {"n": {"minimum": 0, "maximum": 3}}},
                     "else": {"properties": {"n": {"minimum": 100, "maximum": 102}}}},
    "not_type_enum_required": {"type": "object", "properties": {
        "s": {"type": "string", "maxLength": 2, "not": {"enum": ["a", "b\n"]}},
        "v": {"not": {"type": ["object", "array", "string", "number"]}},
        "o": {"type": "object", "properties": {"p": {"type": "null"}, "q": {"type": "null"}},
              "not": {"required": ["p", "q"]}}}, "required": ["s", "v", "o"]},
    "not_pattern": {"type": "object", "properties": {
        "s": {"type": "string", "minLength": 1, "maxLength": 3, "not": {"pattern": "^[a-c\\s]+$"}},
        "t": {"type": ["string", "null"], "maxLength": 2, "not": {"type": "string", "pattern": "b"}}},
        "required": ["s", "t"]},
    "not_any_of_and_typed_enum": {
        "type": "object", "additionalProperties": False, "required": ["s"],
        "properties": {"s": {"type": ["string", "integer"], "maxLength": 2, "minimum": 0, "maximum": 3,
                             "not": {"type": "string", "enum": ["a", "b", 1]}},
                       "x": {"type": "null"}, "y": {"type": "null"}, "z": {"type": "null"}, "k": {"enum": ["p", "q"]}},
        "not": {"anyOf": [{"required": ["x"]}, {"required": ["y", "z"]},
                          {"required": ["z"], "properties": {"k": {"const": "p"}}}]}},
    "one_of_beside_a_branch_of_any_value": {"type": "object", "required": ["v"], "additionalProperties": False,
                                            "properties": {"v": {"oneOf": [{"title": "anything", "x-note": 1},
                                                                           {"type": "string"}, {"enum": [True, None]}]}}},
    "one_of_arrays_apart_by_item_type": {"type": "object", "required": ["v"], "additionalProperties": False, "properties": {
        "v": {"oneOf": [{"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "string", "maxLength": 2}},
                        {"type": "array", "minItems": 1, "maxItems": 2, "items": {"type": "object"}}]}}},
    "not_all_of_required": {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"}},
                            "not": {"allOf": [{"required": ["a"]}, {"required": ["b"]}]}},
    "not_ref": {"$defs": {"banned": {"enum": ["ab", "b"]}, "alias": {"$ref": "#/$defs/banned"}},
                "type": "string", "maxLength": 2, "not": {"$ref": "#/$defs/alias"}},
    "one_of_tagged_recursive": {"$defs": {"node": {"oneOf": [
        {"type": "object", "properties": {"kind": {"const": "leaf"}, "v": {"type": "integer", "minimum": 0, "maximum": 9}},
         "required": ["kind", "v"], "additionalProperties": False},
        {"allOf": [{"$ref": "#/$defs/tagged_pair"}], "properties": {"kids": {"type": "array", "maxItems": 2,
                                                                          "items": {"$ref": "#/$defs/node"}}}}]},
        "tagged_pair": {"type": "object", "properties": {"kind": {"enum": ["pair", 2]}, "kids": {}},
                        "required": ["kind", "kids"], "additionalProperties": False}},
        "$ref": "#/$defs/node"},
    "one_of_tagged": {"oneOf": [{"type": "object", "properties": {"t": {"const": 1}, "x": {"type": "boolean"}},
                                 "required": ["t"]},
                                {"type": "object", "properties": {"t": {"enum": [1.5, "1"]}, "x": {"type": "null"}},
                                 "required": ["t"]}]},
    "one_of_forbidden_required": {"$defs": {"d": {"oneOf": [
        {"properties": {"mode": {"enum": ["custom"]}, "name": {"type": "string", "maxLength": 3},
                        "kid": {"$ref": "#/$defs/d"}}, "additionalProperties": False},
        {"properties": {"mode": {"enum": ["custom", "ref"]}, "ref_id": {"type": "integer", "minimum": 0, "maximum": 5}},
         "required": ["ref_id"], "additionalProperties": False}]}}, "$ref": "#/$defs/d"},
    "property_names": {"type": "object", "propertyNames": {"pattern": "^[a-c]{1,2}$"},
                       "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 1}},
    "tuple_items": {"$schema": DRAFT4, "type": "array", "items": [{"type": "boolean"}, {"type": "integer", "minimum": 0, "maximum": 3}],
                    "additionalItems": {"type": "null"}, "maxItems": 4},
    "integer_multiple_of": {"type": "integer", "multipleOf": 7, "minimum": -50, "maximum": 80},
    "number_multiple_of_hundredth": {"type": "number", "multipleOf": 0.01, "minimum": -1, "maximum": 1},
    "pattern_with_lengths": {"type": "string", "pattern": "^[a-z]+[0-9]*$", "minLength": 3, "maxLength": 5},
    "decimal_bounds": {"type": "number", "minimum": 0.01, "exclusiveMaximum": 2.5},
    "unique_enum_items": {"type": "array", "items": {"enum": ["a", "b", 1, 1.0, None]}, "uniqueItems": True,
                          "minItems": 1},
    "cycle_through_refs_with_siblings": {"$defs": {
        "a": {"type": "object", "properties": {"v": {"type": "integer", "minimum": 0, "maximum": 3},
                                               "next": {"$ref": "#/$defs/b", "required": ["w"]}},
              "additionalProperties": False},
        "b": {"type": "object", "properties": {"w": {"type": "boolean"}, "back": {"$ref": "#/$defs/a", "maxProperties": 1}},
              "additionalProperties": False}}, "$ref": "#/$defs/a", "required": ["v"]},
    "one_of_recursive_by_required_key": {"$defs": {"p": {"oneOf": [
        {"type": "object", "required": ["and"], "properties": {"and": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/p"}}}},
        {"type": "object", "required": ["not"], "properties": {"not": {"$ref": "#/$defs/p"}}},
        {"type": "object", "required": ["eq"], "properties": {"eq": {"type": "integer", "minimum": 0, "maximum": 9}}}]}},
        "$ref": "#/$defs/p"},
    "one_of_recursive_by_type": {"$defs": {"j": {"oneOf": [
        {"type": "null"}, {"type": "number"}, {"type": "array", "maxItems": 3, "items": {"$ref": "#/$defs/j"}},
        {"type": "boolean"}]}}, "$ref": "#/$defs/j"},
    "dependencies_on_a_discriminator": {
        "$schema": "http://json-schema.org/draft-07/schema#", "type": "object", "additionalProperties": False,
        "properties": {"kind": {"enum": ["a", "b", "c"]}, **{f"p{i}": {"type": "boolean"} for i in range(7)}},
        "dependencies": {f"p{i}": {"properties": {"kind": {"enum": [["a"], ["a", "b"], ["c"]][i % 3]}}} for i in range(7)}},
    "enum_beside_keywords_of_other_types": {"type": "object", "properties": {
        "kind": {"type": "string", "additionalProperties": False, "enum": ["simple", "complex"]},
        "v": {"enum": ["a", 1, 0, "bcd", None], "minLength": 2, "minimum": 1}}, "required": ["kind", "v"]},
    "if_then_chain_on_a_discriminator_recursive": {"$defs": {"n": {
        "type": "object", "additionalProperties": False,
        "properties": {"kind": {"enum": ["a", "b", "c"]}, "kid": {"$ref": "#/$defs/n"},
                       "x": {"type": "integer", "minimum": 0, "maximum": 9}, "y": {"type": "boolean"}},
        "allOf": [{"if": {"properties": {"kind": {"const": "a"}}}, "then": {"required": ["x"]}},
                  {"if": {"properties": {"kind": {"enum": ["b"]}}, "required": ["kind"]}, "then": {"required": ["y"]},
                   "else": {"properties": {"y": False}}}]}}, "$ref": "#/$defs/n"},
    "many_any_of_pairs_recursive": {"$defs": {"n": {
        "type": "object", "required": ["v"], "additionalProperties": False,
        "properties": {"v": {"type": "integer"}, "kid": {"$ref": "#/$defs/n"}},
        "allOf": [{"anyOf": [{"properties": {"v": {"minimum": i, "maximum": i + 1}}} for i in range(9)]},
                  {"anyOf": [{"properties": {"v": {"maximum": 2 * j}}} for j in range(8)]}]}}, "$ref": "#/$defs/n"},
    "pattern_negative_look_ahead": {"type": "string", "pattern": "^(?!ab|^c\\.)[a-d.]{0,3}$"},
    "pattern_positive_look_ahead": {"type": "string", "pattern": "^(?=a|b)[a-c]+", "maxLength": 3},
    "anchored_alternatives": {"type": "string", "pattern": "^ab$|^c[0-9]$|x"},
    "anchors_inside_a_group": {"type": "string", "pattern": "(^([0-9]+)\\.(?:[0-9]{1,2})$)", "maxLength": 5},
    "group_around_a_search": {"type": "string", "pattern": "(?:b[0-9])", "maxLength": 4},
    "recursive_min_max_properties": {"$defs": {"n": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 9}, "kid": {"$ref": "#/$defs/n"}, "b": {"type": "null"}},
        "minProperties": 1, "maxProperties": 2}}, "$ref": "#/$defs/n"},
    "unevaluated_properties": {"type": "object", "properties": {"a": {"type": "boolean"}},
                               "unevaluatedProperties": False},
    "ref_with_siblings_inside_recursion": {"$defs": {"node": {"type": "object", "properties": {
        "v": {"type": "integer", "minimum": 0, "maximum": 9},
        "kids": {"type": "array", "maxItems": 2, "items": {"allOf": [{"$ref": "#/$defs/node"}],
                                                           "properties": {"v": {"maximum": 5}}}},
        "alt": {"$ref": "#/$defs/node", "required": ["kids"]}},
        "required": ["v"], "additionalProperties": False}}, "$ref": "#/$defs/node"},
    "one_of_recursive_tag_against_a_map_of_false": {"$defs": {
        "repo": {"type": "object", "oneOf": [{"$ref": "#/$defs/leaf"}, {"$ref": "#/$defs/tree"}]},
        "leaf": {"type": "object", "required": ["type", "url"], "additionalProperties": False,
                 "properties": {"type": {"enum": ["leaf"]}, "url": {"type": "string", "maxLength": 3}}},
        "tree": {"type": "object", "required": ["type", "kids"], "additionalProperties": False,
                 "properties": {"type": {"enum": ["tree"]},
                                "kids": {"type": "array", "maxItems": 2, "items": {"$ref": "#/$defs/item"}}}},
        "item": {"oneOf": [{"$ref": "#/$defs/repo"},
                           {"type": "object", "additionalProperties": {"enum": [False]}, "maxProperties": 1}]}},
        "$ref": "#/$defs/item"},
    "percent_escaped_ref": {"definitions": {"a:b c": {"type": "integer", "minimum": 0, "maximum": 9},
                                            "x%y": {"type": "boolean"}},
                            "type": "object", "required": ["p"], "additionalProperties": False,
                            "properties": {"p": {"$ref": "#/definitions/a%3Ab%20c"}, "q": {"$ref": "#/definitions/x%25y"}}},
    "any_of_required_recursive": {"$defs": {"n": {"type": "object", "properties": {
        "a": {"type": "integer", "minimum": 0, "maximum": 3}, "b": {"type": "boolean"}, "kid": {"$ref": "#/$defs/n"}},
        "additionalProperties": False, "anyOf": [{"required": ["a"]}, {"required": ["b"], "title": "t"}]}},
        "$ref": "#/$defs/n"},
    "one_of_required": {"type": "object", "properties": {"a": {"type": "null"}, "b": {"type": "null"},
                                                         "c": {"type": "null"}, "d": {}},
                        "oneOf": [{"required": ["a"]}, {"required": ["b", "c"]}, {"required": ["c", "d"]}],
                        "additionalProperties": False},  # open, random walks nest undeclared values too deep
    "dependencies_beside_a_free_value": {"$schema": DRAFT4, "type": "object", "properties": {
        "x": {"type": "object", "properties": {"p": {}, "q": {"type": "integer", "minimum": 0, "maximum": 9}}},
        "m": {"type": "integer", "minimum": 0, "maximum": 9}, "s": {"type": "boolean"}},
        "dependencies": {"s": ["m"]}, "additionalProperties": False},
    "any_of_overlapping_recursive_containers": {"$defs": {"n": {"anyOf": [
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 3}, "kid": {"$ref": "#/$defs/n"},
                                          "b": {"type": "null"}}, "additionalProperties": False},
        {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 3}, "kid": {"$ref": "#/$defs/n"},
                                          "c": {"type": "boolean"}}, "additionalProperties": False},
        {"type": "array", "items": {"$ref": "#/$defs/n"}, "maxItems": 2},
        {"type": "array", "items": {"type": "string", "maxLength": 1}}]}}, "$ref": "#/$defs/n"},
}
FORMAT_EXAMPLES = {"uri": "https://user@example.com:8080/a/b?q=1#f", "uri-reference": "../x?y#z",
                   "hostname": "a-b.example.org", "ipv6": "fe80::1:2", "date": "2024-02-28",
                   "date-time": "2024-02-28T12:00:00Z", "duration": "P1Y2M3DT4H", "time": "10:00:00+01:00"}
KEYWORD_SCHEMAS.update({f"format_{f}": {"type": "string", "format": f} for f in FORMAT_EXAMPLES})


def mutants(value, rng: random.Random, depth: int = 0) -> list:
    """Small edits of a JSON value: dropped or added members, retyped or nudged values."""
    out: list = ["x", 0, None, [], {}]
    if isinstance(value, dict):
        for key in list(value):
            out.append({k: v for k, v in value.items() if k != key})
            if depth < 3:
                out += [{**value, key: m} for m in rng.sample(mutants(value[key], rng, depth + 1), 4)]
        out += [{**value, "zz": 1}, {**value, "x-q": True}, {**value, "ab": 1}, {**value, "d": 2}]
    elif isinstance(value, list):
        out += [value[:-1], value + [None], value + value[:1], [True] + value]
        if depth < 3:
            out += [[m if i == j else v for j, v in enumerate(value)] for i, v in enumerate(value)
                    for m in rng.sample(mutants(v, rng, depth + 1), 3)]
    elif isinstance(value, str):
        out += [value + "x", value[:-1], value + "9", "", value.upper(), "a", "b\n", value + "é"]
    elif isinstance(value, bool) or value is None:
        out += [not value, 1]
    elif isinstance(value, int | float):
        out += [value + 1, value - 1, value + 7, -value, value * 10, value + 0.5, value + 0.001, value - 0.001,
                str(value)]
    return out


def decimal_multiple_of(validator, step, instance, schema):
    """multipleOf in exact decimals, as the specification defines it (jsonschema divides floats, so
    0.57 is not a multiple of 0.01 there)."""
    if validator.is_type(instance, "number") and Decimal(repr(instance)) % Decimal(repr(step)) != 0:
        yield jsonschema.ValidationError(f"{instance!r} is not a multiple of {step!r}")


def validator(schema):
    """The schema's own draft, with that draft's format checks (the merged FormatChecker() reads "time"
    as draft 3 does) and exact multipleOf."""
    cls = jsonschema.validators.validator_for(schema)
    exact = jsonschema.validators.extend(cls, {"multipleOf": decimal_multiple_of})
    return exact(schema, format_checker=cls.FORMAT_CHECKER)


def accepts(constraint, text: str) -> bool:
    state = constraint.advance_bytes(constraint.initial(), text.encode())
    return state is not None and constraint.can_end(state)


@pytest.mark.parametrize("name", sorted(KEYWORD_SCHEMAS))
def test_outputs_validate_and_accepted_mutants_validate_too(name, compiler, walk):
    schema = KEYWORD_SCHEMAS[name]
    constraint = compiler.compile("json_schema", schema)
    rng = random.Random(name)
    refused = 0
    for text in complete_outputs(constraint, walk, seed=len(name), wanted=10, max_tokens=300):
        value = json.loads(text)
        validator(schema).validate(value)
        for mutant in mutants(value, rng):
            mutant_text = json.dumps(mutant, ensure_ascii=False, separators=(",", ":"))
            if accepts(constraint, mutant_text):
                validator(schema).validate(mutant)
            else:
                refused += not validator(schema).is_valid(mutant)
    assert refused > 0, "some mutants are invalid and must be refused"


@pytest.mark.parametrize("name, valid", [
    ("pattern_properties", {"id": 3, "x-ab": True}),
    ("additional_properties_schema", {"a": None, "zz": 2, "yy": 3}),
    ("min_max_properties", {"a": None, "c": 5}),
    ("recursive_min_max_properties", {"a": 1, "kid": {"kid": {"b": None}}}),
    ("dependencies_draft4", {"card": 1, "billing": "abc"}),
    ("dependencies_draft4", {"billing": "x"}),
    ("dependent_schemas", {"a": 1, "b": 7}),
    ("all_of_several", {"a": 8, "b": "xy"}),
    ("ref_with_siblings", 10),
    ("draft4_id_refs", ["ab", "c"]),
    ("keyword_beside_and_inside_any_of", {"k": -4}),
    ("if_then_else", {"kind": "b", "n": 101}),
    ("not_type_enum_required", {"s": "c", "v": True, "o": {"q": None}}),
    ("property_names", {"ab": 1, "c": 0}),
    ("not_pattern", {"s": "ad", "t": None}),
    ("not_pattern", {"s": "a-", "t": "ac"}),
    ("not_all_of_required", {"b": None}),
    ("one_of_arrays_apart_by_item_type", {"v": ["ab", ""]}),
    ("one_of_arrays_apart_by_item_type", {"v": [{"a": [1]}, {}]}),
    ("one_of_beside_a_branch_of_any_value", {"v": [1, {"a": "b"}]}),
    ("not_any_of_and_typed_enum", {"s": 1, "y": None}),
    ("not_any_of_and_typed_enum", {"s": "c", "z": None, "k": "q"}),
    ("tuple_items", [True, 2, None, None]),
    ("integer_multiple_of", -49),
    ("number_multiple_of_hundredth", -0.57),
    ("pattern_with_lengths", "abc12"),
    ("decimal_bounds", 0.05),
    ("unique_enum_items", [None, "b", 1]),
    ("any_of_required_recursive", {"a": 1, "b": True, "kid": {"b": False, "kid": {"a": 0}}}),
    ("one_of_required", {"a": None, "b": None}),
    ("percent_escaped_ref", {"p": 3, "q": True}),
    ("one_of_recursive_tag_against_a_map_of_false", {"type": "leaf", "url": "ab"}),
    ("one_of_recursive_tag_against_a_map_of_false", {}),
    ("one_of_recursive_tag_against_a_map_of_false", {"type": "tree", "kids": [{"type": "leaf", "url": "ab"}, {"z": False}]}),
    ("one_of_recursive_tag_against_a_map_of_false", {"type": False}),
    ("one_of_required", {"b": None, "c": None}),
    ("dependencies_beside_a_free_value", {"x": {"p": [1, {}], "q": 3}, "m": 1, "s": True}),
    ("ref_with_siblings_inside_recursion", {"v": 9, "kids": [{"v": 5, "kids": [{"v": 0}]}, {"v": 1, "alt": {"v": 8, "kids": []}}]}),
    ("any_of_overlapping_recursive_containers", {}),
    ("any_of_overlapping_recursive_containers", []),
    ("any_of_overlapping_recursive_containers", {"a": 1, "kid": [{"c": True}, ["x"]], "b": None}),
    ("any_of_overlapping_recursive_containers", {"a": 1, "kid": {"a": 2}, "c": False}),
    ("cycle_through_refs_with_siblings", {"v": 1, "next": {"w": True, "back": {"next": {"w": False}}}}),
    ("one_of_recursive_by_required_key", {"and": [{"not": {"eq": 3}}, {"and": []}]}),
    ("one_of_recursive_by_type", [-1.5, [None, [True]], 7]),
    ("dependencies_on_a_discriminator", {"kind": "b", "p1": True, "p4": False}),
    ("dependencies_on_a_discriminator", {"p0": True, "p2": False}),
    ("enum_beside_keywords_of_other_types", {"kind": "simple", "v": 1}),
    ("enum_beside_keywords_of_other_types", {"kind": "complex", "v": None}),
    ("enum_beside_keywords_of_other_types", {"kind": "simple", "v": "bcd"}),
    ("if_then_chain_on_a_discriminator_recursive", {"kind": "a", "kid": {"kind": "b", "y": True}, "x": 1}),
    ("if_then_chain_on_a_discriminator_recursive", {"kid": {"kind": "c"}, "x": 3}),
    ("many_any_of_pairs_recursive", {"v": 9, "kid": {"v": 0}}),
    ("pattern_negative_look_ahead", "ba"),
    ("pattern_negative_look_ahead", "c"),
    ("pattern_negative_look_ahead", ""),
    ("pattern_positive_look_ahead", "bcx"),
    ("anchored_alternatives", "c7"),
    ("anchors_inside_a_group", "12.5"),
    ("group_around_a_search", "ab7c"),
    *((f"format_{f}", example) for f, example in FORMAT_EXAMPLES.items()),
])
def test_hand_written_valid_instances_are_accepted(name, valid, compiler):
    schema = KEYWORD_SCHEMAS[name]
    validator(schema).validate(valid)
    constraint = compiler.compile("json_schema", schema)
    assert accepts(constraint, json.dumps(valid, separators=(",", ":")))


@pytest.mark.parametrize("lo, hi", [
    ((Decimal("0.01"), False), None), ((Decimal("-2.5"), True), (Decimal("0.125"), False)),
    (None, (Decimal("-0.3"), True)), ((Decimal("1.05"), False), (Decimal("1.25"), True)),
    ((Decimal("0"), True), (Decimal("0.001"), False)), ((Decimal("-1"), False), (Decimal("-1"), False)),
    ((Decimal("7"), True), (Decimal("12.5"), True)),
])
def test_decimal_bounds_are_exact_against_brute_force(lo, hi):
    dfa = compile_dfa([number_node(lo, hi)])
    rng = random.Random(str((lo, hi)))
    texts = ["0", "-0", "0.05", "0.01", "0.009", "0.0100", "-2.5", "-2.49", "0.125", "0.1251", "-0.3", "-0.31",
             "1.05", "1.049", "1.25", "1.2499", "0.001", "0.0005", "-1", "-1.0", "-1.01", "7", "7.0001", "12.5",
             "12.49", "00.1", "1.", ".5"]
    texts += [f"{rng.uniform(-4, 14):.{rng.randint(0, 5)}f}" for _ in range(3000)]
    for text in texts:
        q = dfa.walk(dfa.start, text.encode())
        accepted = q >= 0 and bool(dfa.accept[q] >= 0)
        well_formed = json_number(text)
        value = Decimal(text) if well_formed else None
        expected = well_formed and (lo is None or (value > lo[0] if lo[1] else value >= lo[0])) \
            and (hi is None or (value < hi[0] if hi[1] else value <= hi[0]))
        assert accepted == expected, (lo, hi, text)


def json_number(text: str) -> bool:
    try:
        return isinstance(json.loads(text), int | float)
    except json.JSONDecodeError:
        return False


def test_minimum_one_hundredth_accepts_five_hundredths(compiler):
    constraint = compiler.compile("json_schema", {"type": "number", "minimum": 0.01})
    assert accepts(constraint, "0.05") and accepts(constraint, "0.01") and accepts(constraint, "3")
    assert not accepts(constraint, "0.009") and not accepts(constraint, "0") and not accepts(constraint, "-1")


ANNOTATED = {
    "$schema": "http://json-schema.org/draft-04/schema#", "id": "http://example.com/s.json", "title": "T",
    "description": "d", "examples": [{}], "default": {}, "$comment": "c", "x-kubernetes-group": "g", "_format": "f",
    "links": [{"rel": "self"}], "self": {"vendor": "v"}, "name": "n", "example": 1, "readOnly": True,
    "type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 3, "deprecated": True,
                                           "writeOnly": False, "format": "int32", "x-order": 1}},
    "required": ["a"],
}


def test_annotations_and_unknown_keywords_are_ignored():
    plain = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 3}}, "required": ["a"]}
    assert compile_json_schema(ANNOTATED, strict=True).root == compile_json_schema(plain, strict=True).root


def test_properties_named_like_keywords_are_properties(compiler, walk):
    schema = {"type": "object", "properties": {
        "additionalProperties": {"type": "integer", "minimum": 0, "maximum": 5}, "type": {"const": "t"},
        "$ref": {"type": "boolean"}, "properties": {"type": "null"}, "description": {"type": "string", "maxLength": 2}},
        "required": ["additionalProperties", "type", "$ref", "properties", "description"],
        "additionalProperties": False}
    for text in complete_outputs(compiler.compile("json_schema", schema), walk, seed=4):
        value = json.loads(text)
        jsonschema.validate(value, schema)
        assert set(value) == set(schema["properties"])


@pytest.mark.parametrize("schema, message", [
    ({"type": "array", "items": {"type": "integer"}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "array", "items": {"enum": list(range(9))}, "uniqueItems": True}, "uniqueItems"),
    ({"type": "array", "contains": {"const": 1}}, "contains"),
    ({"not": {"minLength": 2}}, "not"),
    ({"$ref": "other.json#/a"}, "no document is fetched"),
])
def test_constraints_that_cannot_be_enforced_are_refused_by_name(schema, message):
    with pytest.raises(ValueError, match=message):
        compile_json_schema(schema)


def test_strict_form_refuses_undeclared_properties_and_keys_follow_schema_order(compiler):
    schema = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}}
    constraint = compiler.compile("json_schema_strict", schema)
    assert accepts(constraint, '{"a":1,"b":2}') and accepts(constraint, '{"b":2}')
    assert not accepts(constraint, '{"b":2,"a":1}') and not accepts(constraint, '{"a":1,"c":3}')
    loose = compiler.compile("json_schema_strict", {**schema, "additionalProperties": True})
    assert accepts(loose, '{"a":1,"c":3}') and not accepts(loose, '{"a":1,"c":3,"b":2}')
    assert not accepts(loose, '{"a":1,"\\u0062":3}'), "an escaped declared name is not an undeclared key"


def test_a_large_schema_compiles_as_a_grammar_of_small_pieces(compiler, walk):
    """Schemas whose one regex would be huge (they timed out or passed the NFA limit) become a grammar
    whose large objects are rules; an object with many optional members stays polynomial in Lark."""
    address = {"type": "object", "properties": {f"f{i}": {"type": "string", "maxLength": 40} for i in range(12)},
               "additionalProperties": False}
    schema = {"type": "object", "properties": {f"p{i}": address for i in range(40)},
              "required": ["p0", "p39"], "additionalProperties": False}
    grammar = compile_json_schema(schema)
    assert grammar.rules, "too large for one regex"
    constraint = compiler.compile("json_schema", schema)
    for text in complete_outputs(constraint, walk, seed=2, wanted=4, max_tokens=400):
        validator(schema).validate(json.loads(text))
    assert accepts(constraint, json.dumps({"p0": {"f3": "x"}, "p7": {}, "p39": {"f0": "", "f11": "y"}},
                                          separators=(",", ":")))
    assert not accepts(constraint, json.dumps({"p0": {"f3": "x" * 41}, "p39": {}}, separators=(",", ":")))


def test_recursive_one_of_is_a_union_only_when_no_value_can_match_two_branches():
    node = {"type": "object", "properties": {"k": {"oneOf": [{"$ref": "#/$defs/n"}, {"type": "null"}]}}}
    assert compile_json_schema({"$defs": {"n": node}, "$ref": "#/$defs/n"}).rules
    overlapping = {"type": "object", "properties": {"k": {"oneOf": [{"$ref": "#/$defs/n"}, {"type": "object"}]}}}
    with pytest.raises(ValueError, match="oneOf"):
        compile_json_schema({"$defs": {"n": overlapping}, "$ref": "#/$defs/n"})


def test_if_without_then_or_else_constrains_nothing():
    assert compile_json_schema({"type": "integer", "if": {"pattern": "("}}).root == \
        compile_json_schema({"type": "integer"}).root


def test_unique_items_over_open_item_sets_is_refused_unless_explicitly_relaxed():
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 9}, "uniqueItems": True}
    with pytest.raises(ValueError, match="relax"):
        compile_json_schema(schema)
    relaxed = compile_json_schema(schema, relaxed=["uniqueItems"])
    assert relaxed.root == compile_json_schema({**schema, "uniqueItems": False}).root
    assert relaxed.unenforced == ("uniqueItems at #",)  # reported (a response's meta_info names it)
    enum_items = {"type": "array", "items": {"enum": [1, 2]}, "uniqueItems": True}
    assert compile_json_schema({"properties": {"a": enum_items}}, relaxed=["uniqueItems"]).unenforced == ()
    many = {**enum_items, "items": {"enum": list(range(9))}}  # past the automaton over sets of values used
    assert compile_json_schema(many, relaxed=["uniqueItems"]).unenforced == ("uniqueItems at #",)
    assert compile_json_schema({"properties": {"a": schema}}, relaxed=["uniqueItems"]).unenforced == \
        ("uniqueItems at #/properties/a",)
    with pytest.raises(ValueError, match="relaxed keywords"):
        compile_json_schema(schema, relaxed=["pattern"])


@pytest.mark.parametrize("schema, message", [
    ({"allOf": [{"properties": [1]}, {"properties": {"a": {}}}]}, "malformed"),
    ({"type": "object", "properties": {"a": {}}, "patternProperties": {"(": {}}}, "not a valid regex"),
    ({"type": "object", "required": "a"}, "required a list"),
])
def test_malformed_schemas_raise_value_errors(schema, message):
    with pytest.raises(ValueError, match=message):
        compile_json_schema(schema)


def test_not_with_a_ref_excludes_exactly_the_targets_values(compiler):
    schema = KEYWORD_SCHEMAS["not_ref"]
    constraint = compiler.compile("json_schema", schema)
    for value in ["ab", "b", "a", "", "ba", "abc", 3]:
        text = json.dumps(value)
        assert accepts(constraint, text) == validator(schema).is_valid(value), value


def test_one_of_beside_a_branch_of_any_value_matches_exactly_the_values_no_other_branch_does(compiler):
    schema = KEYWORD_SCHEMAS["one_of_beside_a_branch_of_any_value"]
    constraint = compiler.compile("json_schema", schema)
    for v in ["a", "", 1, 2.5, None, True, False, [], [1], {}, {"v": "a"}]:
        text = json.dumps({"v": v}, separators=(",", ":"))
        assert accepts(constraint, text) == validator(schema).is_valid({"v": v}), v


def test_not_any_of_and_not_typed_enum_exclude_exactly_their_values(compiler):
    schema = KEYWORD_SCHEMAS["not_any_of_and_typed_enum"]
    constraint = compiler.compile("json_schema", schema)
    for s in ["a", "b", "c", 1, 0, 4, "ab"]:
        for present, k in itertools.product(([], ["x"], ["y"], ["z"], ["y", "z"], ["x", "z"]), ([], ["p"], ["q"])):
            value = {"s": s, **{name: None for name in present}, **{"k": v for v in k}}
            text = json.dumps(value, separators=(",", ":"))
            assert accepts(constraint, text) == validator(schema).is_valid(value), value


@pytest.mark.parametrize("narrowing", [{"enum": ["a", "b"], "const": "a"}, {"enum": ["a", 1], "type": "integer"}])
def test_dependencies_on_a_discriminator_admit_only_the_values_their_const_and_type_allow(compiler, narrowing):
    schema = {"type": "object", "properties": {"kind": {"enum": ["a", "b", 1]}, "t": {"type": "integer"}},
              "dependentSchemas": {"t": {"properties": {"kind": narrowing}}}}
    constraint = compiler.compile("json_schema", schema)
    for value in ({"kind": k, **t} for k in ("a", "b", 1) for t in ({}, {"t": 1})):
        assert accepts(constraint, json.dumps(value, separators=(",", ":"))) == validator(schema).is_valid(value), value


@pytest.mark.parametrize("second", [["NONE"], ["MEAN", "NONE"]])
def test_one_of_enums_with_no_common_value_keeps_the_objects_own_semantics(compiler, second):
    # disjoint enums need no product, nor the strict form's report (JSONSchemaBench's o9958); overlapping
    # ones are a product of the branches, "MEAN" in both and so refused
    schema = {"type": "object", "properties": {"m": {"oneOf": [{"type": "string", "enum": ["FIRST", "MEAN"]},
                                                               {"type": "string", "enum": second}]},
                                               "n": {"type": "integer"}}}
    constraint = compiler.compile("json_schema", schema)
    assert any("strict form" in r for r in unenforced(constraint)) == ("MEAN" in second)
    for m, order in itertools.product(["FIRST", "MEAN", "NONE", "X"], [("m", "n"), ("n", "m")]):
        value = {key: m if key == "m" else 1 for key in order}
        text = json.dumps(value, separators=(",", ":"))
        assert accepts(constraint, text) == validator(schema).is_valid(value), text


def test_recursive_one_of_branches_without_a_disjoint_discriminator_are_refused(compiler):
    node = {"oneOf": [{"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "n": {"$ref": "#"}},
                       "required": ["k"]},
                      {"type": "object", "properties": {"k": {"enum": ["b", "c"]}}, "required": ["k"]}]}
    with pytest.raises(ValueError, match="recursive branches that may match the same value"):
        compiler.compile("json_schema", node)


def test_recursive_one_of_relaxed_is_their_union_and_reported(vocab):
    """Relaxed (the engine's default): every valid value passes, and what passes that is invalid matches
    two branches (the anyOf of them), as the report says."""
    node = {"oneOf": [{"type": "object", "properties": {"k": {"enum": ["a", "b"]}, "n": {"$ref": "#"}},
                       "required": ["k"], "additionalProperties": False},
                      {"type": "object", "properties": {"k": {"enum": ["b", "c"]}}, "required": ["k"],
                       "additionalProperties": False}]}
    constraint = ConstraintCompiler(lambda: vocab, json_relaxed="oneOf").compile("json_schema", node)
    assert constraint.unenforced == ("oneOf at # (recursive branches that may overlap, as anyOf)",)
    union = {"anyOf": node["oneOf"]}
    for k, n in itertools.product("abcd", [None, {"k": "a"}, {"k": "b"}, {"k": "c"}]):
        value = {"k": k, **({} if n is None else {"n": n})}
        ok = accepts(constraint, json.dumps(value, separators=(",", ":")))
        assert ok == validator(union).is_valid(value), value  # so every valid value passes
    assert not validator(node).is_valid({"k": "b"}) and accepts(constraint, '{"k":"b"}'), "the leak reported"


def test_an_any_of_with_a_free_branch_holds_every_value_and_parses_once(compiler):
    """A branch that is `{}` through a `$ref` makes the anyOf hold for every value; an object branch
    beside it would be a second parse of the same text (an LALR conflict where values recurse)."""
    schema = {"$defs": {"free": {"description": "anything"}, "obj": {"type": "object", "properties": {
        "o": {"anyOf": [{"$ref": "#/$defs/free"}, {"type": "object", "properties": {"k": {"$ref": "#/$defs/obj"}}}]}}}},
        "$ref": "#/$defs/obj"}
    constraint = compiler.compile("json_schema", schema)
    for value in ({"o": 1}, {"o": {"k": {"o": [[]]}}}, {"o": {"k": 3}}, {"o": "s", "z": {}}, [], {"o": None}):
        assert accepts(constraint, json.dumps(value, separators=(",", ":"))) == validator(schema).is_valid(value), value


def test_overlapping_required_choices_over_a_recursive_value_compile_to_a_grammar():
    """anyOf over `required` lists overlaps (an object with both names matches twice): as LALR rules
    that would be a conflict, so the branches are rewritten to exclude each other."""
    for name in ("any_of_required_recursive", "dependencies_beside_a_free_value"):
        assert compile_json_schema(KEYWORD_SCHEMAS[name]).rules


def test_large_strings_become_rules_and_keep_their_exact_length(compiler):
    schema = {"type": "object", "properties": {"a": {"type": "string", "maxLength": 3000},
                                               "b": {"type": "string", "minLength": 2, "maxLength": 2500},
                                               "c": {}}, "required": ["a", "b"]}
    assert any(name.startswith("piece_") for name in compile_json_schema(schema).rules)
    constraint = compiler.compile("json_schema", schema)
    for a, b in [(3000, 2500), (0, 2), (3001, 2), (5, 1), (5, 2501)]:
        value = {"a": "x" * a, "b": "é" * b, "c": [None]}
        assert accepts(constraint, json.dumps(value, ensure_ascii=False, separators=(",", ":"))) == \
            validator(schema).is_valid(value), (a, b)


def test_leading_look_aheads_match_python_re_on_every_short_string(compiler):
    import itertools

    for name in ("pattern_negative_look_ahead", "pattern_positive_look_ahead"):
        schema = KEYWORD_SCHEMAS[name]
        constraint = compiler.compile("json_schema", schema)
        for n in range(5):
            for chars in itertools.product("abcd.x", repeat=n):
                text = "".join(chars)
                assert accepts(constraint, json.dumps(text)) == validator(schema).is_valid(text), (name, text)


def test_long_strings_are_read_in_chunks_and_keep_their_exact_length(compiler):
    schema = {"type": "object", "properties": {"a": {"type": ["string", "null"], "minLength": 1030, "maxLength": 1600},
                                               "b": {"type": "string", "maxLength": 5000}}, "required": ["a"]}
    assert "string_chunk" in compile_json_schema(schema).rules
    constraint = compiler.compile("json_schema", schema)
    for a, b in [(1030, 0), (1029, 0), (1024, 5000), (1536, 5001), (1537, 512), (1600, 1024), (1601, 1)]:
        for char in ("x", "é", "\n"):
            value = {"a": char * a, "b": "y" * b}
            assert accepts(constraint, json.dumps(value, ensure_ascii=False, separators=(",", ":"))) == \
                validator(schema).is_valid(value), (a, b, char)
    assert accepts(constraint, '{"a":null}')


@pytest.mark.parametrize("body, lo, hi", [("email", 0, 1024), ("email", 7, 20), ("date", 10, 10),
                                          ("uuid", 30, None), (r"x(y|zz)w", 4, 4), (r"x(y|zz)w", 3, 9)])
def test_a_length_bound_a_pattern_implies_leaves_its_language_unchanged(body, lo, hi):
    """constrained_string leaves out a bound the body's own lengths imply: the language equals the body
    intersected with every bound (both differences are empty)."""
    from radixlang.runtime.constrained.jsonschema.json_scalars import FORMATS, constrained_string, quoted
    from radixlang.runtime.constrained.regex import regex_ast as ra
    from radixlang.runtime.constrained.regex.automaton import difference, intersection
    from radixlang.runtime.constrained.regex.regex_parser import parse_regex
    node = FORMATS.get(body) or parse_regex(body)
    every = quoted(ra.Compiled(intersection([node, ra.repeat(ra.Chars(((0, ra.MAX_CODE_POINT),)), lo, hi)])))
    built = constrained_string([node], lo, hi)
    for a, b in ((built, every), (every, built)):
        assert difference(a, b).accept.max() < 0


def test_date_formats_accept_exactly_the_dates_jsonschema_checks(compiler):
    """Years 0000-1000 at each digit, month and day edges; the oracle is jsonschema's own format checker
    (Python's date.fromisoformat: no year 0; RFC 3339 has one, so the constraint leaves it out)."""
    checker = jsonschema.FormatChecker()
    dates = [f"{y}-{md}" for y in ("0000", "0001", "0010", "0100", "1000", "2024", "9999")
             for md in ("01-01", "02-28", "04-30", "04-31", "12-31", "13-01", "00-10", "06-00")]
    for fmt, texts in (("date", dates), ("date-time", [d + "T12:00:00Z" for d in dates])):
        constraint = compiler.compile("json_schema", {"type": "string", "format": fmt})
        for text in texts:
            assert accepts(constraint, json.dumps(text)) == checker.conforms(text, fmt), (fmt, text)


def test_every_format_jsonschema_checks_is_enforced_or_reported(compiler):
    """The oracle is jsonschema's 2020-12 format checker: each format it asserts is enforced here, or the schema
    compiles with it reported as not enforced (a response's meta_info names it; JSONSchemaBench's `"format":
    "regex"` instances were false accepts nothing reported). Other formats are annotations: no report."""
    from radixlang.runtime.constrained.jsonschema.json_types import KNOWN_FORMATS
    checker = jsonschema.Draft202012Validator.FORMAT_CHECKER
    for fmt in sorted(checker.checkers):
        schema = {"type": "object", "properties": {"p": {"type": "string", "format": fmt}}}
        expected = () if fmt in KNOWN_FORMATS else (f"format {fmt} at #/properties/p",)
        assert compile_json_schema(schema).unenforced == expected, fmt
    regex = compiler.compile("json_schema", {"type": "string", "format": "regex"})
    assert not checker.conforms("[", "regex") and accepts(regex, '"["')  # not enforced ...
    assert unenforced(regex) == ("format regex at #",)  # ... and said so
    # an allOf part's format is merged away before the string compiles: reported where the part names it
    assert compile_json_schema({"allOf": [{"type": "string"}, {"format": "uri-template"}]}).unenforced == \
        ("format uri-template at #/allOf/1",)
    assert compile_json_schema({"type": ["integer", "null"], "format": "regex"}).unenforced == ()  # no strings
    assert compile_json_schema({"type": "string", "format": "int32"}).unenforced == ()  # an annotation


def test_a_key_several_patterns_match_takes_all_their_schemas(compiler):
    """JSON Schema applies every patternProperties entry whose pattern matches a key; such keys were refused
    outright (JSONSchemaBench o82151's `hipchat` beside `.*`: a false reject). jsonschema is the oracle."""
    strict_hipchat = {"type": "object", "properties": {"enabled": {"type": "boolean"}, "url": {"type": "string"}},
                      "additionalProperties": False}
    loose = {"type": "object", "properties": {"enabled": {"type": "boolean"}, "level": {"type": "integer"}}}
    schemas = [
        {"type": "object", "patternProperties": {"hipchat": strict_hipchat, ".*": loose}},
        {"type": "object", "patternProperties": {"^a": {"type": "integer"}, "b$": {"type": "number", "minimum": 3},
                                                 "^ab": {"type": "integer", "maximum": 5}}, "additionalProperties": False},
        {"type": "object", "properties": {"abc": {"type": "integer"}},
         "patternProperties": {"^a": {"type": "integer"}, "c$": {"type": "number", "maximum": 5}}},
    ]
    instances = ['{"hipchat":{"enabled":true,"url":"u"}}', '{"hipchat":{"level":1}}', '{"hipchat":{"url":1}}',
                 '{"xhipchatx":{}}', '{"x":{"level":2}}', '{"x":{"level":"2"}}', '{"hipchat":1}', '{"ab":4}',
                 '{"ab":2}', '{"ab":6}', '{"a":1}', '{"b":1}', '{"b":"x"}', '{"a":"x"}', '{"abc":9}', '{"ac":6}',
                 '{"c":7}', '{"zc":"s"}', '{"a":1,"ab":3,"b":4}']
    for schema in schemas:
        constraint = compiler.compile("json_schema", schema)
        validator = jsonschema.Draft202012Validator(schema)
        for text in instances:
            assert accepts(constraint, text) == validator.is_valid(json.loads(text)), (schema, text)


def test_an_allof_of_choices_keeps_the_pairs_some_value_satisfies(compiler):
    """allOf of two oneOf / anyOf whose branches pair up as types that never meet (a string and a null) was refused
    whole as unsatisfiable (JSON:API's pagination links, JSONSchemaBench o366: a false reject of every `next`); the
    pairs that hold for no value drop out. jsonschema is the oracle."""
    link = {"oneOf": [{"type": "string", "maxLength": 4}, {"type": "object", "required": ["href"],
                                                           "properties": {"href": {"type": "string"}}}]}
    page = {"oneOf": [{"type": "string"}, {"type": "null"}]}
    instances = ['"/b"', '"/long"', '"/longer"', "null", '{"href":"/x"}', "1", '{"a":1}']
    for schema in ({"allOf": [link, page]}, {"allOf": [{"anyOf": link["oneOf"]}, {"anyOf": page["oneOf"]}]},
                   {"type": "object", "properties": {"next": {"allOf": [link, page]}}}):
        constraint = compiler.compile("json_schema", schema)
        validator = jsonschema.Draft202012Validator(schema)
        for text in instances:
            doc = text if "properties" not in schema else '{"next":' + text + "}"
            assert accepts(constraint, doc) == validator.is_valid(json.loads(doc)), (schema, doc)
    with pytest.raises(ValueError, match="no value"):  # no pair at all: still refused as unsatisfiable
        compiler.compile("json_schema", {"allOf": [{"oneOf": [{"type": "integer"}, {"type": "boolean"}]}, page]})


def test_undeclared_members_of_two_kinds_follow_one_another_in_a_grammar(compiler):
    """A declared member's comma was one lexeme with it (`,"a":"..."`) where an undeclared member's stood alone
    (its value a rule): after a comma the lexer read `,"` on into the declared one and refused any other key
    (JSONSchemaBench's strmprivacy DataConnector). jsonschema is the oracle."""
    schema = {"type": "object", "properties": {"a": {"type": "string"}}, "patternProperties": {"^b$": {"type": "string"}},
              "additionalProperties": {"title": "any value"}}
    constraint = compiler.compile("json_schema", schema)
    validator = jsonschema.Draft202012Validator(schema)
    for text in ('{"x":1,"y":2}', '{"b":"s","x":[1]}', '{"x":{},"b":"s","a":"t","y":null}', '{"b":1}', '{"a":2,"x":1}',
                 '{"x":1,"a":"s","y":{"z":[true]}}'):
        assert accepts(constraint, text) == validator.is_valid(json.loads(text)), text


@pytest.mark.parametrize("draft", ["http://json-schema.org/draft-07/schema#", "http://json-schema.org/draft-04/schema#",
                                   "https://json-schema.org/draft/2020-12/schema", None])
def test_keywords_beside_a_ref_apply_as_the_schemas_draft_says(compiler, draft):
    """Up to draft-07 a `$ref` replaces its object (its siblings are ignored: JSONSchemaStore's briefcase, whose
    `{"$ref": <object>, "enum": [strings]}` was refused whole); from 2019-09 on, and with no `$schema`, they apply
    beside it. Against the library's validator for the schema's own draft."""
    schema = {"definitions": {"thing": {"type": "object", "properties": {"k": {"type": "string"}}}},
              "type": "object", "properties": {"a": {"$ref": "#/definitions/thing", "required": ["k"]},
                                               "b": {"$ref": "#/definitions/thing", "enum": ["x", "y"]}}}
    if draft is not None:
        schema["$schema"] = draft
    constraint = compiler.compile("json_schema", schema)
    check = validator(schema)
    for text in ('{"a":{}}', '{"a":{"k":"v"}}', '{"a":{"k":1}}', '{"b":{"k":"v"}}', '{"b":"x"}', '{"b":{}}', "{}"):
        assert accepts(constraint, text) == check.is_valid(json.loads(text)), (draft, text)


def test_one_of_branches_too_large_for_their_product_are_refused_at_once_or_relaxed_as_any_of(vocab):
    """Overlapping oneOf branches of long bounded strings: their exact product would run for seconds and end past
    the DFA bound (JSONSchemaBench's o9804 ran into the 10 s deadline). Not relaxed, the oneOf is refused by name
    before the product; relaxed (the engine's default), it is their anyOf, reported, against the library's anyOf."""
    long = {"type": "string", "maxLength": 30000}
    node = {"oneOf": [{"type": "object", "properties": {"a": long, "b": long, "x": {"type": "integer"}},
                       "additionalProperties": False},
                      {"type": "object", "properties": {"a": long, "c": long, "y": {"type": "integer"}},
                       "additionalProperties": False}]}
    with pytest.raises(ValueError, match="oneOf at #: its branches may overlap, and they are too large"):
        ConstraintCompiler(lambda: vocab).compile("json_schema", node)
    constraint = ConstraintCompiler(lambda: vocab, json_relaxed="oneOf").compile("json_schema", node)
    assert [r for r in constraint.unenforced if r.startswith("oneOf at #")], constraint.unenforced
    union = validator({"anyOf": node["oneOf"]})
    for text in ('{"a":"s"}', '{"x":1,"a":"s"}', '{"c":"t","y":2}', '{"x":"s"}', '{"x":1,"y":2}', '{"b":"s","c":"t"}'):
        assert accepts(constraint, text) == union.is_valid(json.loads(text)), text
