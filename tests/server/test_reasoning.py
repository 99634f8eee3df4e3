"""Reasoning models on the OpenAI routes, through the `openai` SDK, on a tiny random model that "thinks"
(testing/thinking_llama.py: its template opens `<think>` in the generation prompt). Random weights never
close the block, so every bounded answer here is the engine closing it at the thinking budget. Oracles:
`jsonschema` for the answers and the calls, the SDK's own parse of the stream, SGLang's reasoning parser
(tests/lang/test_reasoning.py) for the split."""
from __future__ import annotations

import json

import pytest

from radixlang.testing.thinking_llama import write_thinking_model

from .conftest import serving

openai = pytest.importorskip("openai", reason="the openai SDK is the peer client these tests speak through")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the oracle for the answers")

SCHEMA = {"type": "object", "properties": {"city": {"type": "string", "maxLength": 8},
                                           "days": {"type": "integer", "minimum": 1, "maximum": 9}},
          "required": ["city", "days"], "additionalProperties": False}
WEATHER = {"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 8}}, "required": ["city"],
    "additionalProperties": False}}}
MESSAGES = [{"role": "user", "content": "Plan a trip: which city, how many days?"}]
BUDGET = 8


@pytest.fixture(scope="module")
def thinking_server(tmp_path_factory):
    with serving(write_thinking_model(tmp_path_factory.mktemp("thinking"))) as live:
        yield live


@pytest.fixture
def client(thinking_server):
    with openai.OpenAI(base_url=f"{thinking_server.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
        yield c
    thinking_server.wait_idle()


def _thinking_tokens(choice) -> int:
    """How many of the generated tokens (logprobs name each) spell the reasoning: those before the end marker."""
    reasoning, spelled, n = choice.message.model_extra["reasoning_content"], "", 0
    for t in choice.logprobs.content:
        if not reasoning.startswith(spelled + t.token):
            break
        spelled, n = spelled + t.token, n + 1
    assert spelled == reasoning or reasoning.startswith(spelled)
    return n


def _json_format() -> dict:
    return {"type": "json_schema", "json_schema": {"name": "trip", "schema": SCHEMA}}


def test_detected_parser_is_deepseek_r1(thinking_server):
    """The template opens the block without an enable_thinking switch: DeepSeek-R1's parser."""
    assert thinking_server.engine.reasoning_parser == "deepseek-r1"


def test_budget_closes_the_block_and_the_answer_follows_the_schema(client):
    reply = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=64, seed=3,
                                           response_format=_json_format(), logprobs=True,
                                           extra_body={"thinking_token_budget": BUDGET})
    choice = reply.choices[0]
    reasoning = choice.message.model_extra["reasoning_content"]
    # the prompt opened the block, so the count starts at the first generated token: the budget's 8 tokens
    # (7 when the 8th began the end marker, which the engine then finished)
    assert reasoning and BUDGET - 1 <= _thinking_tokens(choice) <= BUDGET
    assert "</think>" not in reasoning and "</think>" not in choice.message.content
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    assert choice.finish_reason == "stop"


def test_budget_then_required_tool_calls(client):
    """One call (random weights never end a call list of their own: with parallel calls the list runs to
    max_tokens, which the reply reports as "length"; SmolLM2 ending its lists is tests/e2e's)."""
    reply = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=64, seed=5,
                                           tools=[WEATHER], tool_choice="required", parallel_tool_calls=False,
                                           extra_body={"thinking_token_budget": BUDGET})
    choice = reply.choices[0]
    assert choice.finish_reason == "tool_calls" and len(choice.message.tool_calls) == 1
    assert choice.message.model_extra["reasoning_content"]
    for call in choice.message.tool_calls:
        assert call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])


@pytest.mark.parametrize("stream_reasoning", [True, False])
def test_stream_joins_to_the_whole_reply(client, stream_reasoning):
    """SGLang's stream_reasoning=false holds the reasoning back and sends it whole, in one delta."""
    kwargs = dict(model="default", messages=MESSAGES, max_tokens=48, seed=11, temperature=0,
                  response_format=_json_format(), extra_body={"thinking_token_budget": BUDGET})
    whole = client.chat.completions.create(**kwargs).choices[0]
    reasoning, content, reasons = [], "", []
    kwargs["extra_body"] |= {"stream_reasoning": stream_reasoning}
    for event in client.chat.completions.create(stream=True, **kwargs):
        for c in event.choices:
            reasoning += [r] if (r := (c.delta.model_extra or {}).get("reasoning_content")) else []
            content += c.delta.content or ""
            reasons.append(c.finish_reason)
    assert ("".join(reasoning), content) == (whole.message.model_extra["reasoning_content"], whole.message.content)
    assert reasons[-1] == whole.finish_reason == "stop"
    assert len(reasoning) == 1 if not stream_reasoning else len(reasoning) > 1


def test_without_a_budget_the_thinking_runs_until_max_tokens_closes_it(client):
    """No budget, a constraint: the answer waits for the model to close the block (random weights never do),
    until only the block's end marker and the answer's shortest completion fit (closing.py): the reply is
    cut ("length"), its answer valid."""
    reply = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=24, seed=3,
                                           response_format=_json_format())
    choice = reply.choices[0]
    assert choice.finish_reason == "length" and reply.usage.completion_tokens == 24
    assert choice.message.model_extra["reasoning_content"]
    jsonschema.validate(json.loads(choice.message.content), SCHEMA)


def test_budget_needs_a_reasoning_model(server):
    """The SmolLM2-tokenizer tiny model has no thinking template: a budget is a 400 naming the field."""
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as c:
        with pytest.raises(openai.BadRequestError, match="thinking_token_budget"):
            c.chat.completions.create(model="default", messages=MESSAGES, max_tokens=4,
                                      extra_body={"thinking_token_budget": 4})


def test_chat_template_kwargs_reach_the_template(client, thinking_server):
    """Reserved names are refused; others reach the template (the default budget-free reply still splits)."""
    with pytest.raises(openai.BadRequestError, match="chat_template_kwargs"):
        client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=2,
                                       extra_body={"chat_template_kwargs": {"add_generation_prompt": False}})
    reply = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=4,
                                           extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert reply.choices[0].finish_reason == "length"


def test_generate_separates_reasoning_under_a_budget(thinking_server):
    engine = thinking_server.engine
    prompt = engine.tokenizer.apply_chat_template(MESSAGES)
    params = {"max_new_tokens": 48, "temperature": 0, "thinking_token_budget": BUDGET, "json_schema": json.dumps(SCHEMA)}
    with thinking_server.client() as http:
        whole = http.post("/generate", json={"text": prompt, "sampling_params": params}).json()
        split = http.post("/generate", json={"text": prompt, "sampling_params": params,
                                             "separate_reasoning": True}).json()
        route = http.post("/separate_reasoning", json={"text": whole["text"]}).json()
        bad = http.post("/separate_reasoning", json={"text": "x", "reasoning_parser": "gpt-7"})
    # the prompt opened the block, so the raw text starts inside it: "<reasoning></think>{...}"
    reasoning, answer = whole["text"].split("</think>")
    assert (split["reasoning_text"], split["text"]) == (reasoning, answer)
    jsonschema.validate(json.loads(answer), SCHEMA)
    assert route == {"text": answer, "reasoning_text": reasoning}  # deepseek-r1's parser starts inside the block
    assert bad.status_code == 400 and "gpt-7" in bad.json()["error"]["message"]
    thinking_server.wait_idle()


def test_a_program_thinks_within_its_budget_locally_and_remote(thinking_server):
    import radixlang as rl

    @rl.function
    def trip(s):
        s += rl.user("Plan a trip.")
        s += rl.assistant(rl.separate_reasoning(
            rl.gen("plan", max_tokens=48, temperature=0, json_schema=SCHEMA, thinking_token_budget=BUDGET),
            model_type="deepseek-r1"))

    local = trip.run(backend=rl.EngineBackend(thinking_server.engine))
    remote = trip.run(backend=rl.Endpoint(thinking_server.url), remote=True)
    for state in (local, remote):
        assert state.error() is None
        jsonschema.validate(json.loads(state["plan"]), SCHEMA)
        assert state["plan_reasoning_content"]
    assert (remote["plan"], remote["plan_reasoning_content"]) == (local["plan"], local["plan_reasoning_content"])
    thinking_server.wait_idle()


def test_a_chat_request_without_max_tokens_is_capped(tmp_path):
    with serving(write_thinking_model(tmp_path / "m"), default_max_tokens=5) as live:
        with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as c:
            reply = c.chat.completions.create(model="default", messages=MESSAGES)
        assert (reply.usage.completion_tokens, reply.choices[0].finish_reason) == (5, "length")
        live.wait_idle()


def test_qwen3s_template_from_a_file_thinks_or_not_as_enable_thinking_says(tmp_path):
    """--chat-template: Qwen3's template (tests/runtime/models/test_chat_templates.py) makes the parser qwen3.
    Its generation prompt leaves the block to the model, so with a budget the engine opens it (`<think>`),
    closes it at the budget, and the answer follows the schema; enable_thinking false writes an empty block
    into the prompt, and the whole reply is the answer."""
    from tests.runtime.models.test_chat_templates import QWEN3

    (tmp_path / "qwen3.jinja").write_text(QWEN3)
    model = write_thinking_model(tmp_path / "m")
    with serving(model, chat_template=str(tmp_path / "qwen3.jinja")) as live:
        assert live.engine.reasoning_parser == "qwen3"
        with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0, timeout=120) as c:
            def ask(**extra):
                return c.chat.completions.create(model="default", messages=MESSAGES, max_tokens=48, seed=2,
                                                 response_format=_json_format(), extra_body=extra).choices[0]

            thinking = ask(thinking_token_budget=4)
            plain = ask(chat_template_kwargs={"enable_thinking": False})
        assert thinking.message.model_extra["reasoning_content"] and thinking.finish_reason == "stop"
        jsonschema.validate(json.loads(thinking.message.content), SCHEMA)
        assert plain.message.model_extra["reasoning_content"] is None and plain.finish_reason == "stop"
        jsonschema.validate(json.loads(plain.message.content), SCHEMA)
        live.wait_idle()


def test_agent_protocols_carry_the_thinking_and_its_budget(thinking_server):
    """/v1/messages' `thinking.budget_tokens` is the engine's thinking budget, and the thinking comes back as a
    thinking block (the anthropic SDK parses it); /v1/responses returns it as a reasoning item beside JSON that
    follows the schema (the openai SDK parses it)."""
    anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is the peer client of /v1/messages")
    with anthropic.Anthropic(base_url=thinking_server.url, api_key="unused", max_retries=0, timeout=120) as client:
        message = client.messages.create(
            model="default", max_tokens=64, messages=MESSAGES, thinking={"type": "enabled", "budget_tokens": BUDGET},
            extra_body={"output_config": {"format": {"type": "json_schema", "schema": SCHEMA}}})
    kinds = [block.type for block in message.content]
    assert kinds == ["thinking", "text"], kinds
    assert message.content[0].thinking and "</think>" not in message.content[0].thinking
    jsonschema.validate(json.loads(message.content[1].text), SCHEMA)
    assert message.stop_reason == "end_turn"
    with openai.OpenAI(base_url=f"{thinking_server.url}/v1", api_key="unused", max_retries=0, timeout=120) as client:
        response = client.responses.create(
            model="default", input=MESSAGES[0]["content"], max_output_tokens=64,
            text={"format": {"type": "json_schema", "name": "trip", "schema": SCHEMA}},
            extra_body={"thinking_token_budget": BUDGET})
    assert [item.type for item in response.output] == ["reasoning", "message"]
    jsonschema.validate(json.loads(response.output_text), SCHEMA)
    thinking_server.wait_idle()
