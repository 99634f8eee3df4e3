"""The agent protocols against a live server of the tiny model, through their own SDKs: OpenAI's Responses
API (`client.responses`) and Anthropic's Messages API (`anthropic`). Oracles: the SDKs' own parsing and
stream accumulation, transformers' chat template for the input token counts, jsonschema for JSON replies
and tool arguments, and the whole reply for the joined stream (greedy decoding)."""
from __future__ import annotations

import json

import pytest

openai = pytest.importorskip("openai", reason="the openai SDK is the peer client of /v1/responses")
anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is the peer client of /v1/messages")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the oracle for JSON replies")
transformers = pytest.importorskip("transformers", reason="its chat template counts the prompt's tokens")

WEATHER_SCHEMA = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 8}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}
RESPONSES_TOOL = {"type": "function", "name": "get_weather", "description": "Current weather in a city.",
                  "parameters": WEATHER_SCHEMA}
ANTHROPIC_TOOL = {"name": "get_weather", "description": "Current weather in a city.", "input_schema": WEATHER_SCHEMA}
ANSWER_SCHEMA = {"type": "object", "properties": {"ok": {"type": "boolean"}, "n": {"type": "integer", "minimum": 0,
                                                                                   "maximum": 9}},
                 "required": ["ok", "n"], "additionalProperties": False}
PNG = "data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8/5+hHgAHggJ/PchI7wAAAABJRU5ErkJggg=="


@pytest.fixture(scope="module")
def hf_tokenizer(tiny_model_dir):
    return transformers.AutoTokenizer.from_pretrained(str(tiny_model_dir))


def prompt_tokens(hf_tokenizer, messages, **kwargs) -> int:
    return len(hf_tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                                return_dict=False, **kwargs))


@pytest.fixture
def oai(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c


@pytest.fixture
def claude(server):
    with anthropic.Anthropic(base_url=server.url, api_key="unused", max_retries=0, timeout=120) as c:
        yield c


# ---- /v1/responses --------------------------------------------------------------------------------
def test_responses_text_whole_and_streamed(server, oai, hf_tokenizer):
    kwargs = dict(model="default", instructions="Be brief.", input="Say hello.", max_output_tokens=6, temperature=0,
                  reasoning={"effort": "low", "summary": "auto"})  # accepted: this template has no thinking switch
    whole = oai.responses.create(**kwargs)
    expected = prompt_tokens(hf_tokenizer, [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Say hello."}])
    assert whole.object == "response" and whole.id.startswith("resp_")
    assert whole.usage.input_tokens == expected and whole.usage.output_tokens == 6
    assert whole.status == "incomplete" and whole.incomplete_details.reason == "max_output_tokens"
    assert [item.type for item in whole.output] == ["message"] and whole.reasoning.effort == "low"

    events = list(oai.responses.create(stream=True, **kwargs))
    assert [e.sequence_number for e in events] == list(range(len(events)))
    types = [e.type for e in events]
    assert types[:5] == ["response.created", "response.in_progress", "response.output_item.added",
                         "response.content_part.added", "response.output_text.delta"]
    assert types[-4:] == ["response.output_text.done", "response.content_part.done", "response.output_item.done",
                          "response.incomplete"]
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    assert text == whole.output_text == events[-1].response.output_text
    assert events[-1].response.usage.input_tokens == expected


def test_responses_forced_tool_call_round_trip(server, oai):
    kwargs = dict(model="default", input="What is the weather in Paris?", tools=[RESPONSES_TOOL],
                  tool_choice={"type": "function", "name": "get_weather"}, parallel_tool_calls=False,
                  max_output_tokens=80)
    with oai.responses.stream(**kwargs) as stream:
        events = list(stream)
        first = stream.get_final_response()
    calls = [item for item in first.output if item.type == "function_call"]
    assert first.status == "completed" and len(calls) == 1 and calls[0].name == "get_weather"
    jsonschema.validate(json.loads(calls[0].arguments), WEATHER_SCHEMA)
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    done = [e for e in events if e.type == "response.function_call_arguments.done"]
    assert deltas == done[0].arguments == calls[0].arguments

    # the tool's result continues the stored conversation
    result = {"type": "function_call_output", "call_id": calls[0].call_id, "output": '{"temperature": 21}'}
    follow = oai.responses.create(model="default", previous_response_id=first.id, max_output_tokens=4,
                                  tools=[RESPONSES_TOOL], tool_choice="none", input=[result])
    assert follow.previous_response_id == first.id
    assert follow.usage.input_tokens > first.usage.input_tokens + first.usage.output_tokens - 4
    assert follow.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens


def test_responses_json_schema_then_cached_follow_up(server, oai):
    first = oai.responses.create(
        model="default", input="Answer in JSON.", max_output_tokens=60, temperature=0,
        text={"format": {"type": "json_schema", "name": "answer", "schema": ANSWER_SCHEMA, "strict": True}})
    assert first.status == "completed"
    jsonschema.validate(json.loads(first.output_text), ANSWER_SCHEMA)
    assert oai.responses.retrieve(first.id).output_text == first.output_text

    pins = server.engine.stats()["kv_pins"]
    follow = oai.responses.create(model="default", previous_response_id=first.id, input="And again?",
                                  max_output_tokens=2)
    assert follow.usage.input_tokens_details.cached_tokens >= first.usage.input_tokens
    assert server.engine.stats()["kv_pins"] == pins + 1  # the follow-up's own sequence

    oai.responses.delete(follow.id)
    assert server.engine.stats()["kv_pins"] == pins
    with pytest.raises(openai.NotFoundError):
        oai.responses.retrieve(follow.id)


def test_responses_bad_input_is_a_400_in_openai_shape(server, oai):
    cases = [({"input": [{"type": "web_search_call"}]}, "input[0].type"),
             ({"input": "hi", "previous_response_id": "resp_nope"}, "previous_response_id"),
             ({"input": "hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
             ({"input": "hi", "text": {"format": {"type": "json_schema"}}}, "text.format.schema"),
             ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": PNG}]}]},
              "input[0].content[0]")]  # this model has no vision tower
    for fields, param in cases:
        with pytest.raises(openai.BadRequestError) as e:
            oai.responses.create(model="default", max_output_tokens=4, **fields)
        assert e.value.body["param"] == param, e.value.body
    with pytest.raises(openai.BadRequestError) as e:  # a result must answer an earlier call
        oai.responses.create(model="default", max_output_tokens=4, instructions="Be brief.", input=[
            {"role": "user", "content": "hi"}, {"type": "function_call_output", "call_id": "call_x", "output": "x"}])
    assert e.value.body["param"] == "input[1].call_id"


# ---- /v1/messages ---------------------------------------------------------------------------------
def test_messages_text_whole_streamed_and_stop_sequence(server, claude, hf_tokenizer):
    kwargs = dict(model="default", max_tokens=8, extra_body={"temperature": 0}, system="Be brief.",
                  messages=[{"role": "user", "content": [{"type": "text", "text": "Say hello."}]}])
    whole = claude.messages.create(**kwargs)
    expected = prompt_tokens(hf_tokenizer, [{"role": "system", "content": "Be brief."},
                                            {"role": "user", "content": "Say hello."}])
    assert whole.type == "message" and whole.role == "assistant" and whole.stop_reason == "max_tokens"
    assert whole.usage.input_tokens + whole.usage.cache_read_input_tokens == expected
    assert claude.messages.count_tokens(model="default", system=kwargs["system"],
                                        messages=kwargs["messages"]).input_tokens == expected
    assert whole.usage.output_tokens == 8
    text = whole.content[0].text

    with claude.messages.stream(**kwargs) as stream:
        pieces = list(stream.text_stream)
        final = stream.get_final_message()
    assert "".join(pieces) == final.content[0].text == text
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8

    stop = text.strip()[2:5]  # a stop sequence the greedy reply reaches: the reply ends before it
    assert len(stop) == 3
    cut = claude.messages.create(**kwargs | {"stop_sequences": [stop]})
    assert cut.stop_reason == "stop_sequence" and cut.stop_sequence == stop
    assert cut.content[0].text == text[:text.index(stop)]


def test_messages_forced_tool_use_round_trip(server, claude):
    kwargs = dict(model="default", max_tokens=80, tools=[ANTHROPIC_TOOL],
                  tool_choice={"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True},
                  messages=[{"role": "user", "content": "What is the weather in Paris?"}])
    with claude.messages.stream(**kwargs) as stream:  # the whole reply's shape: tests/server/test_agent_views.py
        events = list(stream)
        final = stream.get_final_message()
    uses = [b for b in final.content if b.type == "tool_use"]
    assert final.stop_reason == "tool_use" and len(uses) == 1 and uses[0].name == "get_weather"
    jsonschema.validate(uses[0].input, WEATHER_SCHEMA)
    types = [e.type for e in events if e.type in ("message_start", "content_block_start", "message_delta",
                                                   "message_stop")]
    assert types == ["message_start", "content_block_start", "message_delta", "message_stop"]
    start = next(e.content_block for e in events if e.type == "content_block_start")
    assert start.type == "tool_use" and start.name == "get_weather" and start.id == uses[0].id
    partial = "".join(e.delta.partial_json for e in events if e.type == "content_block_delta")
    assert json.loads(partial) == uses[0].input

    history = [*kwargs["messages"], {"role": "assistant", "content": [u.model_dump() for u in uses]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": uses[0].id, "content": "21 C"}]}]
    follow = claude.messages.create(model="default", max_tokens=4, tools=[ANTHROPIC_TOOL], tool_choice={"type": "none"},
                                    messages=history)
    assert follow.usage.output_tokens == 4 and follow.stop_reason == "max_tokens"


def test_messages_cache_control_pins_the_prefix(server, claude):
    system = [{"type": "text", "text": "You are a weather bot. " * 20, "cache_control": {"type": "ephemeral"}}]
    pins = server.engine.stats()["kv_pins"]
    replies = [claude.messages.create(model="default", max_tokens=2, system=system,
                                      messages=[{"role": "user", "content": question}])
               for question in ("Paris?", "Rome?")]
    assert server.engine.stats()["kv_pins"] == pins + 1  # one key for the prefix: the second moved its pin
    assert replies[1].usage.cache_read_input_tokens >= 100


def test_messages_bad_input_is_a_4xx_in_anthropic_shape(server, claude):
    cases = [dict(messages=[{"role": "user", "content": "hi"}]),  # no max_tokens
             dict(max_tokens=4, messages=[{"role": "user", "content": [{"type": "document"}]}]),
             dict(max_tokens=4, messages=[{"role": "user", "content": [  # this model has no vision tower
                 {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": PNG[22:]}}]}]),
             dict(max_tokens=4, messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "{"}]),
             dict(max_tokens=4, messages=[{"role": "user", "content": "hi"}], tool_choice={"type": "any"}),
             dict(max_tokens=4, messages=[{"role": "user", "content": "hi"}],
                  thinking={"type": "enabled", "budget_tokens": 8})]
    with server.client() as http:
        for body in cases:
            r = http.post("/v1/messages", json={"model": "default", **body})
            assert r.status_code == 400, r.text
            assert r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error"
    with pytest.raises(anthropic.NotFoundError) as e:
        claude.messages.create(model="claude-nope", max_tokens=4, messages=[{"role": "user", "content": "hi"}])
    assert e.value.body["error"]["type"] == "not_found_error"


@pytest.mark.parametrize("route, body", [
    ("/v1/responses", {"input": "Tell me a long story.", "max_output_tokens": 900}),
    ("/v1/messages", {"messages": [{"role": "user", "content": "Tell me a long story."}], "max_tokens": 900})])
def test_a_client_leaving_a_stream_aborts_it(server, route, body):
    before = server.engine.stats()["generated_tokens_total"]
    with server.client() as http, http.stream("POST", route, json={"model": "default", "stream": True, **body}) as r:
        assert r.status_code == 200
        assert next(r.iter_lines()).startswith("event: ")
    server.wait_idle()  # no request left running, every KV token accounted for
    assert server.engine.stats()["generated_tokens_total"] - before < 900 - 100  # it stopped early
