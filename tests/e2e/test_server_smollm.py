"""The real SmolLM2 behind a live server: the HTTP answers are the engine's own greedy tokens."""
from __future__ import annotations

import json

import httpx
import openai
import pytest

from radixlang.server.launch import background_server

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]


@pytest.fixture(scope="module")
def smollm_url(smollm_engine):
    with background_server(smollm_engine) as server:
        yield server.url
    smollm_engine.check_invariants()


def test_chat_answers_like_the_in_process_engine(smollm_engine, smollm_url):
    prompt = smollm_engine.tokenizer.apply_chat_template(QUESTION)
    expected = smollm_engine.generate(prompt, {"temperature": 0, "max_new_tokens": 24})
    with openai.OpenAI(base_url=f"{smollm_url}/v1", api_key="unused", max_retries=0) as client:
        out = client.chat.completions.create(model="default", messages=QUESTION, max_tokens=24, temperature=0)
    assert out.choices[0].message.content == expected.text
    assert "Paris" in out.choices[0].message.content


def test_native_stream_of_real_text_ends_with_the_full_completion(smollm_engine, smollm_url):
    prompt = "The three primary colors are"
    expected = smollm_engine.generate(prompt, {"temperature": 0, "max_new_tokens": 20})
    text = ""
    with httpx.stream("POST", f"{smollm_url}/generate", timeout=120, json={
            "text": prompt, "stream": True, "sampling_params": {"temperature": 0, "max_new_tokens": 20}}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                text = json.loads(line[6:])["text"]
    assert text == expected.text and text.strip()


TOOL_PROMPTS = ["What is the weather in Paris?", "Add 17 and 25.", "Search for the tallest mountain.",
                "Is it raining in Tokyo right now, in fahrenheit?", "What's 3 plus 4?", "Find news about the Olympics.",
                "Weather in Berlin and London please.", "Compute 100 + 250 for me."]
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city.",
     "parameters": {"type": "object", "properties": {"city": {"type": "string"}, "unit": {
         "type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}}},
    {"type": "function", "function": {"name": "add", "description": "Adds two integers.", "parameters": {
        "type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}, "required": ["a", "b"]}}},
    {"type": "function", "function": {"name": "search", "description": "Search the web.", "parameters": {
        "type": "object", "properties": {"query": {"type": "string"}}, "required": ["query"]}}}]


def test_required_tool_calls_end_when_the_model_ends_them(smollm_url):
    """Issue 44: with the default parallel_tool_calls, each of 8 varied prompts (sampled, max_tokens 64) ends
    with finish_reason "tool_calls" and valid calls, none repeated (the call list used to run to max_tokens)."""
    jsonschema = pytest.importorskip("jsonschema")
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    with openai.OpenAI(base_url=f"{smollm_url}/v1", api_key="unused", max_retries=0, timeout=300) as client:
        choices = [client.chat.completions.create(model="default", messages=[{"role": "user", "content": p}],
                                                  tools=TOOLS, tool_choice="required", max_tokens=64,
                                                  seed=0).choices[0] for p in TOOL_PROMPTS]
    for choice in choices:
        assert choice.finish_reason == "tool_calls", choice
        calls = [(c.function.name, c.function.arguments) for c in choice.message.tool_calls]
        assert len(set(calls)) == len(calls)
        for name, arguments in calls:
            jsonschema.validate(json.loads(arguments), schemas[name])
