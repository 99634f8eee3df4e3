"""gen's dtype / regex / json_schema / grammar reach the engine as constraints; outputs must obey them.

These wait for constrained decoding (issue 5, branch `constrained`): until the engine knows the
`regex`, `json_schema` and `grammar` sampling fields it rejects them, and these tests skip.
"""
from __future__ import annotations

import dataclasses
import json
import re

import pytest

import radixlang as rl
from radixlang.lang.config import DTYPE_REGEXES
from radixlang.runtime.sampling_params import SamplingParams

ENGINE_FIELDS = {f.name for f in dataclasses.fields(SamplingParams)}
needs_constraints = pytest.mark.skipif(
    not {"regex", "json_schema", "grammar"} <= ENGINE_FIELDS,
    reason="the engine has no constrained decoding yet (issue 5)")


def test_constraints_are_sent_as_the_engines_sampling_fields():
    assert rl.gen("n", dtype=int).params.sampling_params() == {"regex": DTYPE_REGEXES["int"], "stop": [" ", "\n"]}
    assert rl.gen("b", dtype=bool).params.sampling_params() == {"regex": DTYPE_REGEXES["bool"]}
    assert rl.gen("n", regex=r"\d+", max_tokens=4).params.sampling_params() == {"regex": r"\d+",
                                                                                 "max_new_tokens": 4}
    assert rl.gen("j", json_schema={"type": "object"}).params.sampling_params() == {
        "json_schema": '{"type": "object"}'}
    assert rl.gen("g", grammar='start: "a"').params.sampling_params() == {"grammar": 'start: "a"'}


@pytest.mark.parametrize("dtype, check", [
    (int, int), (float, float), (bool, lambda t: {"True": True, "False": False}[t]), (str, json.loads)])
def test_dtype_regexes_accept_what_python_parses(dtype, check):
    pattern = DTYPE_REGEXES[dtype.__name__]
    samples = {int: ["0", "-12", "+7"], float: ["1.5", "-0.25", "3", "6.02e23"], bool: ["True", "False"],
               str: ['"hello world"', '""']}[dtype]
    for text in samples:
        assert re.fullmatch(pattern, text)
        check(text)


@needs_constraints
@pytest.mark.parametrize("primitive", [
    lambda: rl.gen_int("v", max_tokens=12), lambda: rl.gen("v", dtype=float, max_tokens=12),
    lambda: rl.gen("v", dtype=bool, max_tokens=4), lambda: rl.gen_string("v", max_tokens=16),
])
def test_dtype_outputs_match_their_type(backend, primitive):
    node = primitive()

    @rl.function
    def typed(s):
        s += "Value: " + node

    state = typed.run(backend=backend, temperature=1.0)
    text, finish = state["v"], state.get_meta_info("v")["finish_reason"]["type"]
    complete = re.fullmatch(DTYPE_REGEXES[node.params.dtype], text)
    assert complete or (finish == "length" and re.fullmatch(PREFIXES[node.params.dtype], text))


# what a dtype's output may look like when max_tokens cuts it short
PREFIXES = {"int": r"[-+]?[0-9]*", "float": r"[-+]?([0-9]+(\.[0-9]*)?([eE][-+]?[0-9]*)?)?",
            "bool": r"(T(r(ue?)?)?|F(a(l(se?)?)?)?)?", "str": r'("[\w\d\s]*)?'}


@needs_constraints
def test_regex_json_schema_and_grammar_outputs_obey_their_constraint(backend):
    # bounded fields and a closed object, so even the random tiny model finishes the object within max_tokens
    schema = {"type": "object", "properties": {"name": {"enum": ["Ann", "Bob"]},
                                               "age": {"type": "integer", "minimum": 0, "maximum": 120}},
              "required": ["name", "age"], "additionalProperties": False}

    @rl.function
    def constrained(s):
        s += "Phone: " + rl.gen("phone", regex=r"[0-9]{3}-[0-9]{4}", max_tokens=20) + "\n"
        s += "Person: " + rl.gen("person", json_schema=schema, max_tokens=64) + "\n"
        s += "Answer: " + rl.gen("answer", grammar='start: "yes" | "no"', max_tokens=8)

    state = constrained.run(backend=backend, temperature=1.0)
    assert state.error() is None
    assert re.fullmatch(r"[0-9]{3}-[0-9]{4}", state["phone"])
    person = json.loads(state["person"])
    assert person["name"] in ("Ann", "Bob") and 0 <= person["age"] <= 120
    assert state["answer"] in ("yes", "no")
