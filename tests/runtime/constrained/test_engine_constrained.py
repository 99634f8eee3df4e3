"""Constrained generation through the engine on the tiny random model, which ignores what a sensible
model would say and so pushes every constraint to its edges. Every output is checked by an
independent oracle (re.fullmatch, jsonschema, Lark's parser) and every scenario ends with the KV
invariant."""
from __future__ import annotations

import asyncio
import json
import re
import uuid

import jsonschema
import lark
import pytest

from radixlang.runtime.sampling_params import SamplingParams
from radixlang.runtime.validation import parse_params

from ...conftest import CHARACTER_REGEX

REGEXES = [r"(yes|no)\. [a-z]{2,6}!", r"[0-9]{3}-[0-9]{4}", r"<(a|b|c){1,4}>( ok)?", r"\{\"k\": (true|false)\}"]
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 6},
        "age": {"type": "integer", "minimum": 0, "maximum": 99},
        "day": {"type": "string", "format": "date"},
        "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
        "score": {"anyOf": [{"type": "number", "minimum": 0, "maximum": 1}, {"type": "null"}]},
    },
    "required": ["name", "age", "day", "tags"],
    "additionalProperties": False,  # open, a random model's sampled undeclared members run past max_new_tokens
}
NESTED = {"type": "array", "items": {"$ref": "#/$defs/v"}, "minItems": 1, "maxItems": 3,
          "$defs": {"v": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 9},
                                    {"type": "array", "items": {"$ref": "#/$defs/v"}, "maxItems": 3}]}}}
GRAMMAR = r"""
start: "(" item ("," item)* ")"
item: WORD | NUM | "<" item ">"
WORD: /[a-z]{1,4}/
NUM: /[0-9]{1,3}/
%ignore " "
"""
PROMPTS = ["Give me data:", "x", "The answer is"]


def check_json(completion, schema):
    assert completion.meta.finish_reason == "stop", completion
    jsonschema.validate(json.loads(completion.text), schema, format_checker=jsonschema.FormatChecker())


def test_regex_outputs_fully_match(tiny_engine):
    for pattern in REGEXES:
        for c in tiny_engine.generate(PROMPTS, {"regex": pattern, "max_new_tokens": 40, "temperature": 0.8, "seed": 3}):
            assert c.meta.finish_reason == "stop" and re.fullmatch(pattern, c.text), (pattern, c.text)
    tiny_engine.check_invariants()


def test_sglang_character_regex_with_unicode_fields_fully_matches(tiny_engine):
    outs = tiny_engine.generate(PROMPTS, {"regex": CHARACTER_REGEX, "max_new_tokens": 600, "temperature": 1.0,
                                          "seed": 7})
    for c in outs:
        assert c.meta.finish_reason == "stop" and re.fullmatch(CHARACTER_REGEX, c.text), c.text
    assert any(not c.text.isascii() for c in outs)  # the random model does pick Unicode \w characters
    tiny_engine.check_invariants()


def test_json_schema_outputs_validate_greedy_and_sampled(tiny_engine):
    for temperature in (0.0, 1.0):
        for c in tiny_engine.generate(PROMPTS, {"json_schema": SCHEMA, "max_new_tokens": 120,
                                                "temperature": temperature, "seed": 5}):
            check_json(c, SCHEMA)
    tiny_engine.check_invariants()


def test_recursive_schema_given_as_a_json_string_validates(tiny_engine):
    outs = tiny_engine.generate(PROMPTS * 3, {"json_schema": json.dumps(NESTED), "max_new_tokens": 100,
                                              "temperature": 1.0, "seed": 2})
    complete = [c for c in outs if c.meta.finish_reason == "stop"]  # the random model may nest forever
    assert len(complete) >= 2 and any("[[" in c.text or ",[" in c.text for c in complete)
    for c in complete:
        check_json(c, NESTED)
    tiny_engine.check_invariants()


def test_lark_grammar_outputs_parse(tiny_engine):
    parser = lark.Lark(GRAMMAR, parser="lalr")
    done = 0
    for c in tiny_engine.generate(PROMPTS * 2, {"grammar": GRAMMAR, "max_new_tokens": 60, "temperature": 0.9,
                                                "seed": 4}):
        if c.meta.finish_reason == "stop":
            parser.parse(c.text)
            done += 1
    assert done >= 3
    tiny_engine.check_invariants()


def test_n_samples_each_follow_the_constraint_independently(tiny_engine):
    outs = tiny_engine.generate("pick:", {"regex": r"[a-z]{3,8}", "n": 6, "temperature": 30.0, "seed": 11,
                                          "max_new_tokens": 20})
    assert len(outs) == 6 and len({c.text for c in outs}) > 1
    for c in outs:
        assert re.fullmatch(r"[a-z]{3,8}", c.text)
    tiny_engine.check_invariants()


def test_eos_comes_exactly_when_the_constraint_is_complete(tiny_engine):
    eos = tiny_engine.tokenizer.eos_token_ids[0]
    c = tiny_engine.generate("q", {"regex": "(ab){2}", "max_new_tokens": 10, "temperature": 0})
    assert c.text == "abab" and c.output_ids[-1] == eos and c.meta.matched_stop == eos
    c = tiny_engine.generate("q", {"regex": "(ab){2}", "max_new_tokens": 10, "temperature": 0, "ignore_eos": True})
    assert c.text == "abab" and eos not in c.output_ids and c.meta.finish_reason == "stop"
    for constraint in ({"grammar": "start: "}, {"regex": ""}):  # complete before any token, no EOS: nothing drawn
        c = tiny_engine.generate("q", constraint | {"max_new_tokens": 4, "ignore_eos": True})
        assert (c.text, c.output_ids, c.meta.finish_reason, c.meta.error) == ("", [], "stop", None), c.meta
    c = tiny_engine.generate("q", {"regex": "(ab){2}", "max_new_tokens": 10, "temperature": 0, "min_new_tokens": 8})
    assert c.text == "abab" and c.meta.finish_reason == "stop"
    tiny_engine.check_invariants()


@pytest.mark.parametrize("params, message", [
    ({"regex": "(?=x)"}, "look-ahead"),
    ({"regex": "[a-"}, "invalid regex"),
    ({"regex": 5}, "regex must be a string"),
    ({"json_schema": {"type": "array", "contains": {"type": "null"}}}, "'contains'"),
    ({"json_schema": "{bad"}, "not valid JSON"),
    ({"grammar": "start: ("}, "malformed"),
    ({"regex": "a", "grammar": 'start: "a"'}, "exclusive"),
])
def test_bad_constraints_raise_at_submit_and_the_engine_stays_healthy(tiny_engine, params, message):
    with pytest.raises(ValueError, match=message):
        tiny_engine.generate("hi", {**params, "max_new_tokens": 5})
    assert re.fullmatch("[0-9]{2}", tiny_engine.generate("hi", {"regex": "[0-9]{2}", "max_new_tokens": 5}).text)
    tiny_engine.check_invariants()


def test_sampling_params_accept_the_constraint_fields():
    p = parse_params({"json_schema": {"type": "integer"}})
    assert p.constraint == ("json_schema", {"type": "integer"})
    assert SamplingParams().constraint is None


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_constraints_survive_preemption(tiny_engine_factory, tiny_engine, mode):
    params = {"json_schema": SCHEMA, "max_new_tokens": 120, "temperature": 0}
    prompts = [f"request {i}: " + "word " * (i % 5) for i in range(8)]
    expected = [c.text for c in tiny_engine.generate(prompts, params)]
    small = tiny_engine_factory(kv_cache_tokens=200, preemption_mode=mode, max_running_requests=8,
                                init_new_token_ratio=0.02, min_new_token_ratio=0.0)  # over-admit on purpose
    got = small.generate(prompts, params)
    assert small.stats()["preemptions_total"] > 0
    for c, want in zip(got, expected):
        check_json(c, SCHEMA)
        assert c.text == want
    small.check_invariants()


def test_abort_mid_constrained_stream_frees_everything(tiny_engine):
    stream = tiny_engine.stream("abort me", {"regex": "[a-z ]{200}", "max_new_tokens": 150, "temperature": 1.0})
    for i, _chunk in enumerate(stream):
        if i == 3:
            break
    stream.close()
    rid = uuid.uuid4().hex
    chunks = []
    for chunk in tiny_engine.stream("abort me too", {"json_schema": SCHEMA, "max_new_tokens": 100}, rid=rid):
        chunks.append(chunk)
        if len(chunks) == 2:
            tiny_engine.abort(rid)
    assert chunks[-1].finished and chunks[-1].finish_reason == "abort"
    tiny_engine.check_invariants()


def test_engine_enforces_unique_items_by_default_and_relaxes_it_when_asked(tiny_engine_factory):
    schema = {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 30}, "uniqueItems": True,
              "maxItems": 6}
    with pytest.raises(ValueError, match="relaxed keywords"):
        tiny_engine_factory(constrained_json_relaxed="uniqueItems,pattern")
    engine = tiny_engine_factory()
    for c in engine.generate(PROMPTS, {"json_schema": schema, "max_new_tokens": 20, "temperature": 1.0, "seed": 1}):
        check_json(c, schema)  # distinct items (unique_items.py)
    engine.check_invariants()
    relaxed = tiny_engine_factory(constrained_json_relaxed="uniqueItems")
    for c in relaxed.generate(PROMPTS, {"json_schema": schema, "max_new_tokens": 20, "temperature": 1.0, "seed": 1}):
        check_json(c, {**schema, "uniqueItems": False})  # generated without the relaxed keyword
    relaxed.check_invariants()


def test_a_lexer_outgrowing_its_bound_mid_decode_ends_only_its_request(tiny_engine, monkeypatch):
    """Lexers are built on first use, so one can outgrow its bound mid-decode: that request ends with the
    error, while the step's other requests decode exactly as they would have alone."""
    from radixlang.runtime.constrained.grammar.constraint import GrammarConstraint
    from radixlang.runtime.constrained.regex.fsa import ConstraintTooLarge

    refused: list = []

    def build_known(self, names):  # lexers the warm-up built are cached; any new one is "too large"
        refused.append(names)
        raise ConstraintTooLarge("constraint is too large: injected")

    async def together(params: list[dict]):  # submitted at once: the plain one runs on past the other's end
        return await asyncio.gather(*(tiny_engine.async_generate(p, q) for p, q in zip(PROMPTS, params)))

    plain = {"max_new_tokens": 24, "temperature": 0, "ignore_eos": True}
    alone = tiny_engine.generate(PROMPTS[0], plain)
    grammar = 'start: "[" PART ("," PART)* "]"\nPART: /[a-q]{1,3}/\n'
    # warming would build this small grammar's every lexer at compile: a large one's are met mid-decode
    monkeypatch.setattr(tiny_engine.constraints, "precompute_s", 0)
    tiny_engine.generate(PROMPTS[1], {"grammar": grammar, "max_new_tokens": 1})  # compiles, and caches it
    monkeypatch.setattr(GrammarConstraint, "_build_lexer", build_known)
    both = asyncio.run(together([plain, {"grammar": grammar, "max_new_tokens": 24}]))
    assert refused  # the injected failure happened, mid-decode
    assert both[0].output_ids == alone.output_ids and both[0].meta.finish_reason == "length"
    assert both[1].meta.finish_reason == "abort" and "too large" in both[1].meta.error, both[1].meta
    tiny_engine.check_invariants()
