"""Schemas that were refused before: `not` of an array schema, and a long patterned string whose byte DFA
is too large; the `jsonschema` library is the oracle for what each accepts."""
from __future__ import annotations

import json

import jsonschema
import pytest

from radixlang.runtime.constrained.compiler import unenforced

# JSONSchemaBench's Github_easy o39084: a oneOf whose first branch every value matches, so "exactly one"
# means "no other": not a string, and not a non-empty array of non-strings
REGEXES = {"oneOf": [{"instanceof": "RegExp"}, {"type": "string"},
                     {"type": "array", "items": {"oneOf": [{"instanceof": "RegExp"}, {"type": "string"}]},
                      "minItems": 1}]}
NOT_ARRAY = {"type": "object", "properties": {"from": REGEXES, "n": {"not": {"type": "array", "maxItems": 2,
                                                                             "items": {"type": "string"}}}}}


def _accepts(constraint, text: str) -> bool:
    state = constraint.advance_bytes(constraint.initial(), text.encode())
    return state is not None and constraint.can_end(state)


@pytest.mark.parametrize("member", ["from", "n"])
def test_not_of_an_array_schema_matches_jsonschema(compiler, member):
    constraint = compiler.compile("json_schema", NOT_ARRAY)
    assert not [r for r in unenforced(constraint) if not r.startswith("property order")]
    validator = jsonschema.Draft7Validator(NOT_ARRAY)
    for value in ['1', '"a"', '[]', '[1]', '["a"]', '[1,"a"]', '[[1],2]', '[[["a"]]]', '{"k":1}', 'null',
                  '[1,[1,"a"]]', '[1,2,3]', '["a","b"]', '["a","b","c"]', '[1.5]', '["a",[{"b":1}]]']:
        text = f'{{"{member}":{value}}}'
        assert _accepts(constraint, text) == validator.is_valid(json.loads(text)), text
    # the items beside the string nest at most two levels deep there (json_not._array_holding): deeper is refused
    assert member == "n" or not _accepts(constraint, '{"from":["a",[{"b":[]}]]}')


def test_a_long_patterned_string_too_large_to_build_leaves_only_its_max_length_unenforced(compiler):
    """JSONSchemaBench's Github_medium o63937: a Unicode \\w pattern over 1,024 characters (~320,000 DFA
    states): the pattern is enforced, the length is reported."""
    schema = {"type": "object", "properties": {"f": {"type": "string", "maxLength": 1024, "minLength": 1,
                                                     "pattern": r"^[\w /-]+\.[0-9a-zA-Z]+$"}}}
    constraint = compiler.compile("json_schema", schema)
    assert unenforced(constraint) == ("maxLength at #/properties/f (with its pattern, too large an automaton: "
                                      "not enforced)",)
    validator = jsonschema.Draft7Validator(schema)
    for value in ["a.png", "é b/c.txt", "a.", ".png", "a.b.c", "ab"]:
        text = json.dumps({"f": value}, ensure_ascii=False, separators=(",", ":"))
        assert _accepts(constraint, text) == validator.is_valid(json.loads(text)), text
