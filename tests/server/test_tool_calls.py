"""OpenAI tool calling against a live server, through the `openai` SDK: every call the constrained paths
return parses and validates (jsonschema) against its tool's schema; streams join to the whole reply."""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai", reason="the openai SDK is the peer client these tests speak through")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the oracle for the arguments")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather in a city.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "maxLength": 12},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"],
        "additionalProperties": False}}}
ADD = {"type": "function", "function": {
    "name": "add", "description": "Adds two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 999},
                                                   "b": {"type": "integer", "minimum": 0, "maximum": 999}},
                   "required": ["a", "b"], "additionalProperties": False}}}
TOOLS = [WEATHER, ADD]
SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
MESSAGES = [{"role": "user", "content": "What is the weather in Paris, and what is 2 + 3?"}]


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


def assert_valid_calls(calls, names=None) -> None:
    assert calls
    for call in calls:
        assert call.type == "function" and call.id
        assert names is None or call.function.name in names
        jsonschema.validate(json.loads(call.function.arguments), SCHEMAS[call.function.name])


def chat(client, **kwargs):
    kwargs.setdefault("max_tokens", 120)
    kwargs.setdefault("seed", 7)
    return client.chat.completions.create(model="default", messages=MESSAGES, tools=TOOLS, **kwargs)


def test_required_returns_only_valid_calls(server, client):
    reply = chat(client, tool_choice="required", temperature=1.0, parallel_tool_calls=False)
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert_valid_calls(choice.message.tool_calls)


def test_named_tool_choice_calls_that_tool_once_without_parallel(server, client):
    reply = chat(client, tool_choice={"type": "function", "function": {"name": "add"}},
                 parallel_tool_calls=False, temperature=1.0)
    calls = reply.choices[0].message.tool_calls
    assert len(calls) == 1
    assert_valid_calls(calls, {"add"})


def test_parallel_required_calls_are_all_valid_however_many(server, client):
    replies = chat(client, tool_choice="required", temperature=1.0, n=3, max_tokens=150)
    for c in replies.choices:  # a random model may go on calling until max_tokens: the whole calls count
        assert c.finish_reason in ("tool_calls", "length")
        assert_valid_calls(c.message.tool_calls)


def test_required_calls_cut_by_max_tokens_end_valid_and_say_length(server, client):
    """A random model never ends a string: the engine closes the call within max_tokens (closing.py)."""
    note = {"type": "function", "function": {"name": "note", "parameters": {
        "type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}}}
    replies = client.chat.completions.create(model="default", messages=MESSAGES, tools=[note], tool_choice="required",
                                             parallel_tool_calls=False, max_tokens=40, temperature=1.0, n=3, seed=5)
    assert any(c.finish_reason == "length" for c in replies.choices)
    for c in replies.choices:
        assert c.finish_reason in ("tool_calls", "length")
        assert c.message.tool_calls, c.message.content
        (call,) = c.message.tool_calls
        jsonschema.validate(json.loads(call.function.arguments), note["function"]["parameters"])
    assert replies.usage.completion_tokens <= 3 * 40


def test_auto_text_is_content_and_any_call_is_valid(server, client):
    replies = chat(client, tool_choice="auto", temperature=1.0, n=3, max_tokens=40)
    for c in replies.choices:
        if c.message.tool_calls:
            assert c.finish_reason in ("tool_calls", "length")
            assert_valid_calls(c.message.tool_calls)
        elif c.finish_reason == "stop":  # a call cut short by max_tokens stays text
            assert isinstance(c.message.content, str) and "<tool_call>" not in c.message.content


def test_none_returns_text_without_parsing(server, client):
    reply = chat(client, tool_choice="none", max_tokens=8)
    assert reply.choices[0].message.tool_calls is None
    assert isinstance(reply.choices[0].message.content, str)


@pytest.mark.parametrize("choice", ["required", "auto"])
def test_stream_joins_to_the_whole_reply(server, client, choice):
    kwargs = dict(tool_choice=choice, temperature=1.0, max_tokens=60, seed=3)
    whole = chat(client, **kwargs).choices[0]
    content, calls, reason = "", {}, None
    for event in chat(client, stream=True, **kwargs):
        for c in event.choices:
            content += c.delta.content or ""
            for d in c.delta.tool_calls or []:
                entry = calls.setdefault(d.index, {"id": None, "name": None, "arguments": ""})
                if d.id:
                    assert entry["id"] is None and not entry["arguments"], "id and name come first"
                    entry["id"], entry["name"] = d.id, d.function.name
                entry["arguments"] += d.function.arguments or ""
            reason = c.finish_reason or reason
    assert reason == whole.finish_reason
    assert content == (whole.message.content or "")
    expected = [(t.function.name, json.loads(t.function.arguments)) for t in whole.message.tool_calls or []]
    assert [(calls[i]["name"], json.loads(calls[i]["arguments"])) for i in sorted(calls)] == expected


def test_history_with_tool_results_renders_and_answers(server, client):
    history = MESSAGES + [
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "5"}]
    reply = client.chat.completions.create(model="default", messages=history, tools=TOOLS, max_tokens=120,
                                           tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=1)
    assert_valid_calls(reply.choices[0].message.tool_calls)
    # SmolLM2's template renders no tools: the documented fallback, in the system and user turns
    prompt = _fallback_text(server, history)
    assert reply.usage.prompt_tokens == len(server.engine.tokenizer.encode(prompt))
    assert '"name": "get_weather"' in prompt.split("<|im_start|>user")[0]
    assert '<|im_start|>assistant\n<tool_call>{"name": "add", "arguments": {"a": 2, "b": 3}}</tool_call>' in prompt
    assert "<|im_start|>user\n<tool_response>\n5\n</tool_response><|im_end|>" in prompt


def _fallback_text(server, history) -> str:
    from radixlang.runtime.tool_formats import fallback_messages

    rendered = [dict(m) | ({"tool_calls": [{"function": {"name": "add", "arguments": {"a": 2, "b": 3}}}]}
                           if m.get("tool_calls") else {}) for m in history]
    return server.engine.tokenizer.apply_chat_template(fallback_messages(rendered, [t["function"] for t in TOOLS]))


BAD_TOOL = {"type": "function", "function": {"name": "bad", "parameters": {
    "type": "object", "properties": {"x": {"type": "string", "pattern": "(a"}}}}}


@pytest.mark.parametrize("kwargs, param, words", [
    (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
     "tool_choice.function.name", "nope"),
    (dict(tools=[ADD, ADD]), "tools[1].function.name", "twice"),
    (dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "array"}}}]),
     "tools[0].function.parameters", "object"),
    (dict(tools=[ADD, BAD_TOOL], tool_choice="required"), "tools[1].function.parameters", "bad"),
    (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice", "sometimes"),
    (dict(messages=[{"role": "tool", "tool_call_id": "call_9", "content": "5"}], tools=TOOLS),
     "messages[0].tool_call_id", "call_9"),
])
def test_bad_tool_requests_are_400s_naming_the_field(server, client, kwargs, param, words):
    kwargs.setdefault("messages", MESSAGES)
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="default", max_tokens=5, **kwargs)
    error = info.value.body
    assert error["param"] == param and words in error["message"]
    assert client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=3).choices


FLAG_TAG = {"begin": "<flag>", "schema": {"type": "object", "properties": {"on": {"type": "boolean"}},
                                          "required": ["on"], "additionalProperties": False}, "end": "</flag>"}


def test_response_format_structural_tag_in_sglangs_spelling(server, client):
    fmt = {"type": "structural_tag", "structures": [FLAG_TAG], "triggers": ["<flag>"]}
    reply = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=30, temperature=1.0, seed=2,
                                           response_format=fmt)
    text = reply.choices[0].message.content
    for part in text.split("<flag>")[1:]:  # every tag that closed is valid (a random model rarely opens one)
        if "</flag>" in part:
            jsonschema.validate(json.loads(part.split("</flag>")[0]), FLAG_TAG["schema"])


def test_generate_takes_a_structural_tag_in_sampling_params(server):
    tag = {"type": "structural_tag", "format": {"type": "tags_with_separator", "separator": "", "at_least_one": True,
                                                "stop_after_first": True, "tags": [
        {"begin": FLAG_TAG["begin"], "content": {"type": "json_schema", "json_schema": FLAG_TAG["schema"]},
         "end": FLAG_TAG["end"]}]}}
    with server.client() as http:
        out = http.post("/generate", json={"text": "Flag:", "sampling_params": {
            "structural_tag": json.dumps(tag), "max_new_tokens": 30}}).json()
        bad = http.post("/generate", json={"text": "Flag:", "sampling_params": {
            "structural_tag": {"type": "structural_tag", "structures": [], "triggers": ["<"]}}})
    assert out["text"].startswith("<flag>") and out["text"].endswith("</flag>")
    jsonschema.validate(json.loads(out["text"][len("<flag>"):-len("</flag>")]), FLAG_TAG["schema"])
    assert bad.status_code == 400 and "structural_tag" in bad.json()["error"]["message"]
