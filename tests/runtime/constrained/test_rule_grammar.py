"""JSON-schema rules -> LALR grammar: long repeats parse in constant stack depth (so masks cache)."""
from __future__ import annotations

import json

import jsonschema


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
