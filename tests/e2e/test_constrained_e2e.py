"""Constrained decoding on the real SmolLM2: outputs validate, and jump-forward does not drift."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

pytestmark = pytest.mark.e2e

PERSON = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 30},
    "age": {"type": "integer", "minimum": 0, "maximum": 130},
    "city": {"type": "string", "maxLength": 30},
}, "required": ["name", "age", "city"]}
TEXTS = [
    "Maria Lopez is a 34 year old engineer living in Madrid.",
    "At 71, retired teacher Tom Becker still bikes around Hamburg every morning.",
    "The violinist Aiko Tanaka (age 25) moved to Vienna last spring.",
]


def chat(engine, text: str) -> str:
    return engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": f"Extract the person's name, age and city as JSON.\n{text}"}])


def test_json_extraction_validates_and_matches_greedy_without_jump_forward(smollm_engine):
    prompts = [chat(smollm_engine, t) for t in TEXTS]
    params = {"json_schema": PERSON, "max_new_tokens": 60, "temperature": 0}
    jumped = smollm_engine.generate(prompts, params)
    core = smollm_engine.core
    jump = core.jump
    core.set_jump_forward(None)  # the same engine, decoding every token
    try:
        plain = smollm_engine.generate(prompts, params)
    finally:
        core.set_jump_forward(jump)
    for a, b in zip(jumped, plain):
        jsonschema.validate(json.loads(a.text), PERSON)
        jsonschema.validate(json.loads(b.text), PERSON)
    assert [a.text for a in jumped] == [b.text for b in plain]  # drafts are verified: no drift
    assert smollm_engine.stats()["jump_forward_tokens_total"] > 0
    assert json.loads(jumped[0].text)["city"] == "Madrid"


def test_regex_and_grammar_with_the_real_model(smollm_engine):
    prompt = chat(smollm_engine, "Is Paris the capital of France? Answer yes or no, then explain briefly.")
    c = smollm_engine.generate(prompt, {"regex": r"(Yes|No)\. [A-Z][a-z ,]{5,60}\.", "max_new_tokens": 40,
                                        "temperature": 0})
    assert re.fullmatch(r"(Yes|No)\. [A-Z][a-z ,]{5,60}\.", c.text)
    grammar = r"""
start: "The sum is " NUMBER "."
NUMBER: /[0-9]+/
"""
    c = smollm_engine.generate(chat(smollm_engine, "What is 2 + 3?"), {"grammar": grammar, "max_new_tokens": 12,
                                                                      "temperature": 0})
    assert re.fullmatch(r"The sum is [0-9]+\.", c.text)
    smollm_engine.check_invariants()
