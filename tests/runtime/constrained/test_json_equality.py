"""JSON Schema's equality of values (json_equality.json_key) against the `jsonschema` library's `const`, and
the keywords that compare values: allOf's const / enum merge, oneOf's disjointness by values."""
from __future__ import annotations

import itertools
import json

import jsonschema
import pytest

from radixlang.runtime.constrained.json_equality import json_key

from .test_json_schema_keywords import accepts

VALUES = [0, 1, 1.0, -0.0, 2.5, True, False, None, "1", "true", "", [1], [1.0], [True], [], {},
          {"a": 1, "b": [None]}, {"b": [None], "a": 1.0}, {"a": True, "b": [None]}, [{"x": 1}, 2], [2, {"x": 1}]]


def test_json_key_equals_exactly_where_const_validates():
    for x, y in itertools.product(VALUES, VALUES):
        same = jsonschema.Draft202012Validator({"const": y}).is_valid(x)
        assert (json_key(x) == json_key(y)) == same, (x, y)


@pytest.mark.parametrize("parts, texts", [
    ([{"const": True}, {"const": 1}], ["true", "1"]),  # Python's True == 1; JSON's are two values
    ([{"const": {"a": [1]}}, {"const": {"a": [True]}}], ['{"a":[1]}', '{"a":[true]}']),
    ([{"enum": [1, "x"]}, {"enum": [True, 1.0]}], ["1", "true", '"x"']),
    ([{"enum": [{"b": 1, "a": 2}]}, {"enum": [{"a": 2, "b": 1.0}, 3]}], ['{"b":1,"a":2}', "3"]),
])
def test_all_of_merges_values_as_json_schema_compares_them(compiler, parts, texts):
    schema = {"allOf": parts}
    validator = jsonschema.Draft202012Validator(schema)
    if not any(validator.is_valid(json.loads(t)) for t in texts):
        with pytest.raises(ValueError, match="no value can satisfy"):
            compiler.compile("json_schema", schema)
        return
    constraint = compiler.compile("json_schema", schema)
    for text in texts:
        assert accepts(constraint, text) == validator.is_valid(json.loads(text)), text
