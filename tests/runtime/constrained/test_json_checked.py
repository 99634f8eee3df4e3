"""Objects a grammar reads in any order, checked on the parser's stack (json_checked, grammar/member_check):
past the eager any-order automaton, and unions of such objects. Oracle: the `jsonschema` library on each
instance (valid ones accepted, invalid ones refused), and random walks of the masks, whose every token
advances and whose finished outputs the library validates."""
from __future__ import annotations

import json
import random

import jsonschema
import pytest

from radixlang.runtime.constrained.compiler import unenforced

MANY = {f"p{i}": {"type": "integer"} for i in range(8)}  # past ANY_ORDER_MAX_PROPERTIES
RECURSIVE = {"type": "object", "properties": {**MANY, "child": {"$ref": "#"}}, "required": ["p3", "p5"],
             "additionalProperties": False}
UNION = {"definitions": {"node": {"anyOf": [
    {"type": "object", "properties": {**MANY, "type": {"const": "a"}, "kids": {"type": "array", "items": {"$ref": "#/definitions/node"}}},
     "required": ["type", "p0"], "additionalProperties": False},
    {"type": "object", "properties": {"type": {"const": "b"}, "name": {"type": "string"}, "p0": {"type": "integer"}},
     "required": ["type", "name"]}]}}, "$ref": "#/definitions/node"}
# a closed branch beside one whose undeclared members have a schema of their own
MAPPED = {"anyOf": [{"type": "object", "properties": {**MANY, "sub": {"$ref": "#"}}, "additionalProperties": False},
                    {"type": "object", "properties": {"$schema": {"type": "string"}}, "additionalProperties": {"type": "string"}}]}
# one key whose value is a different object per branch (starting alike): one member, its value a union
NESTED = {"oneOf": [
    {"type": "object", "properties": {**MANY, "status": {"const": "error"}, "details": {"type": "object"}, "more": {"$ref": "#"}},
     "required": ["status", "details"], "additionalProperties": False},
    {"type": "object", "properties": {"status": {"const": "ok"}, "details": {"type": "object", "properties": {"n": {"type": "integer"}},
     "required": ["n"], "additionalProperties": False}}, "required": ["status", "details"], "additionalProperties": False}]}
# small open objects told apart by a const (a grammar through the recursive member): one checked union
SMALL = {"anyOf": [{"type": "object", "properties": {"type": {"const": "a"}, "a": {"$ref": "#"}}, "required": ["type", "a"]},
                   {"type": "object", "properties": {"type": {"const": "b"}, "b": {"type": "string"}}, "required": ["type", "b"]}]}
# a union of large objects that is no grammar but for them (their lazy form cannot tell the branches apart): one
# branch open, the other declaring `k`; the open one takes `k` with the other's value (a subset of any value)
OPEN = {"anyOf": [{"type": "object", "properties": MANY, "required": ["p1"]},
                  {"type": "object", "properties": {**MANY, "k": {"type": "string"}}, "required": ["p0"]}]}

CASES = [
    (RECURSIVE, '{"p5":1,"p3":2}'),
    (RECURSIVE, '{"p7":1,"p3":2,"child":{"p5":2,"p0":1,"p3":1},"p5":1}'),
    (RECURSIVE, '{"p3":1}'),  # a required member missing
    (RECURSIVE, '{"p7":1,"p3":2,"child":{"p3":1,"p0":1},"p5":1}'),  # ... in the nested object
    (RECURSIVE, '{"p5":1,"p3":2,"p5":3}'),  # a key twice: refused (the library sees the last one)
    (RECURSIVE, '{"x":1,"p3":1,"p5":1}'),  # undeclared, where additionalProperties is false
    (UNION, '{"p4":1,"kids":[{"name":"x","type":"b"}],"p0":2,"type":"a"}'),  # the discriminator last
    (UNION, '{"name":"x","other":[1,{}],"type":"b"}'),  # an undeclared member of the open branch
    (UNION, '{"p0":1,"p7":2,"name":"x","type":"b"}'),  # p7 only in "a", closed: a wrong-branch member
    (UNION, '{"p0":1,"type":"a","name":"x"}'),  # name only in "b"
    (UNION, '{"p0":1,"p1":2}'),  # no branch's required members all written
    (UNION, '{"type":"b","kids":[]}'),  # "b" takes undeclared kids, but lacks its required name
    (MAPPED, '{"p7":1,"sub":{"x":"y"},"p0":2}'),
    (MAPPED, '{"foo":"bar","$schema":"x"}'),
    (MAPPED, '{"foo":1}'),  # an undeclared value of the wrong type
    (MAPPED, '{"p7":1,"foo":"x"}'),  # a member of each branch
    (NESTED, '{"details":{"n":1},"status":"ok"}'),
    (NESTED, '{"details":{"x":[1]},"p1":2,"status":"error"}'),
    (NESTED, '{"details":{},"status":"error"}'),
    (NESTED, '{"details":{"x":1},"status":"ok"}'),  # the error branch's details with the ok status
    (NESTED, '{"status":"ok","details":{"m":1}}'),
    (NESTED, '{"status":"ok","details":{}}'),  # ok's details require n
    (NESTED, '{"details":{"n":1},"status":"ok","p1":1}'),  # p1 only in the error branch
    (SMALL, '{"a":{"b":"x","type":"b"},"type":"a","z":[]}'),
    (SMALL, '{"type":"a","b":"x"}'),  # a's undeclared b, but a missing
    (SMALL, '{"b":1,"type":"b"}'),
    (OPEN, '{"p1":1,"k":"s"}'),  # the open branch's `k`: refused before (its key kept for the other branch)
    (OPEN, '{"k":"s","p0":2,"x":[1]}'),
    (OPEN, '{"p0":1,"k":1}'),  # the other's `k` of the wrong type, p1 missing
    (OPEN, '{"p2":1,"k":"s"}'),  # neither branch's required member
]


def _valid(schema: dict, text: str) -> bool:
    try:
        jsonschema.validate(json.loads(text), schema)
    except jsonschema.ValidationError:
        return False
    return "p5\":3" not in text  # a repeated key: refused by design, whatever the library reads of it


@pytest.mark.parametrize("schema,text", CASES)
def test_members_in_any_order_against_jsonschema(compiler, schema, text):
    constraint = compiler.compile("json_schema", schema)
    assert not any(r.startswith("property order") for r in unenforced(constraint))
    state = constraint.advance_bytes(constraint.initial(), text.encode())
    assert (state is not None and constraint.can_end(state)) == _valid(schema, text)


@pytest.mark.parametrize("schema", [RECURSIVE, UNION, NESTED])
def test_random_walks_of_the_masks_end_in_valid_objects(compiler, walk, schema):
    constraint, rng = compiler.compile("json_schema", schema), random.Random(7)
    for _ in range(8):  # recursive members often nest on past the walk's end: those are checked token by token
        out, complete = walk(constraint, rng, max_tokens=150)  # asserts each allowed token advances
        if complete:
            jsonschema.validate(json.loads(out), schema)
