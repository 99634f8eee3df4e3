"""Every chat route renders the prompt the model's own chat template renders (issue 43): transformers'
apply_chat_template on folders its tokenizer saved (chat_template.jinja) is the oracle. Through the openai SDK (and the anthropic SDK for /v1/messages), a
chat request must report as many prompt tokens as transformers' ids hold and answer what /generate answers on those
ids (greedy: the tiny random model's tokens change with any change of the prompt). The chat route with images is
tests/runtime/multimodal/test_processor_folder.py's (against LlavaProcessor)."""
from __future__ import annotations

import copy
import json

import pytest

from tests.runtime.models.hf_tiny import BASE, save_hf_model
from tests.runtime.models.test_chat_templates import QWEN3, QWEN25, WEATHER_TOOL

from .conftest import serving

transformers = pytest.importorskip("transformers")
openai = pytest.importorskip("openai", reason="the openai SDK is the peer client of these tests")

GREEDY = {"max_tokens": 6, "temperature": 0}
TOOL_HISTORY = [
    {"role": "system", "content": "You check the weather."},
    {"role": "user", "content": "Weather in Paris?"},
    {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function", "function": {
        "name": "get_weather", "arguments": json.dumps({"city": "Paris"})}}]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
]
# Qwen3's template keeps a turn's thinking after the last real query only; a tool response is no query
REASONING_HISTORY = [
    {"role": "user", "content": "Think first."},
    {"role": "assistant", "content": "Let me look.", "reasoning_content": "hm, the weather"},
    {"role": "user", "content": "<tool_response>21 C</tool_response>"},
]


def folder(path, template: str):
    """A tiny Llama saved by transformers, its tokenizer (with `template`) saved by transformers too."""
    config = transformers.LlamaConfig(**(BASE | {"max_position_embeddings": 1024}))  # byte tokens: long prompts
    save_hf_model(path, config, seed=3, bos="<|endoftext|>", eos="<|im_end|>")
    tokenizer = transformers.AutoTokenizer.from_pretrained(str(path))
    tokenizer.chat_template = template
    tokenizer.save_pretrained(str(path))
    assert (path / "chat_template.jinja").exists()
    return transformers.AutoTokenizer.from_pretrained(str(path))


def hf_ids(tokenizer, messages: list[dict], **kwargs) -> list[int]:
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True, **kwargs)
    return tokenizer.encode(text, add_special_tokens=False)


def ask_both(path, messages: list[dict], want: list[int], **chat_kwargs):
    """(the chat reply, /generate's reply on transformers' ids) from one server."""
    with serving(path) as live:
        with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as client:
            chat = client.chat.completions.create(model="default", messages=messages, **GREEDY, **chat_kwargs)
        with live.client() as http:
            native = http.post("/generate", json={"input_ids": want, "sampling_params": {
                "max_new_tokens": GREEDY["max_tokens"], "temperature": 0}})
        live.wait_idle()
    assert native.status_code == 200, native.text
    return chat, native.json()


def test_chat_with_tools_renders_as_transformers(tmp_path):
    tokenizer = folder(tmp_path / "qwen25", QWEN25)
    hf_messages = copy.deepcopy(TOOL_HISTORY)  # transformers' templates take a call's arguments as a dict
    hf_messages[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    want = hf_ids(tokenizer, hf_messages, tools=[WEATHER_TOOL])
    assert tokenizer.decode(want).count("get_weather") == 2  # the tool's schema and the call in the history
    chat, native = ask_both(tmp_path / "qwen25", TOOL_HISTORY, want, tools=[WEATHER_TOOL], tool_choice="none")
    assert chat.usage.prompt_tokens == len(want)
    assert chat.choices[0].message.content == native["text"]


def test_chat_with_reasoning_renders_as_transformers(tmp_path):
    tokenizer = folder(tmp_path / "qwen3", QWEN3)
    want = hf_ids(tokenizer, REASONING_HISTORY, enable_thinking=False)
    text = tokenizer.decode(want)
    assert "<think>\nhm, the weather\n</think>" in text and text.endswith("<think>\n\n</think>\n\n")
    chat, native = ask_both(tmp_path / "qwen3", REASONING_HISTORY, want,
                            extra_body={"chat_template_kwargs": {"enable_thinking": False}})
    assert chat.usage.prompt_tokens == len(want)
    assert chat.choices[0].message.content == native["text"]


def test_responses_and_messages_with_tools_render_as_transformers(tmp_path):
    """/v1/responses (function_call items) and /v1/messages (tool_use / tool_result blocks) carry the same
    tool history to the template as the chat route: transformers' ids, through each protocol's own SDK."""
    anthropic = pytest.importorskip("anthropic", reason="the anthropic SDK is the peer client of /v1/messages")
    tokenizer = folder(tmp_path / "qwen25", QWEN25)
    hf_messages = copy.deepcopy(TOOL_HISTORY)
    hf_messages[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Paris"}
    want = hf_ids(tokenizer, hf_messages, tools=[WEATHER_TOOL])
    function = WEATHER_TOOL["function"]
    with serving(tmp_path / "qwen25") as live:
        with openai.OpenAI(base_url=f"{live.url}/v1", api_key="unused", max_retries=0) as client:
            response = client.responses.create(
                model="default", instructions="You check the weather.", max_output_tokens=6, temperature=0,
                tools=[{"type": "function", **function}], tool_choice="none", store=False,
                input=[{"role": "user", "content": "Weather in Paris?"},
                       {"type": "function_call", "call_id": "call_1", "name": "get_weather",
                        "arguments": json.dumps({"city": "Paris"})},
                       {"type": "function_call_output", "call_id": "call_1", "output": "{\"temp\": 21}"}])
        with anthropic.Anthropic(base_url=live.url, api_key="unused", max_retries=0) as client:
            message = client.messages.create(
                model="default", system="You check the weather.", max_tokens=6, extra_body={"temperature": 0},
                tools=[{"name": function["name"], "description": function["description"],
                        "input_schema": function["parameters"]}], tool_choice={"type": "none"},
                messages=[{"role": "user", "content": "Weather in Paris?"},
                          {"role": "assistant", "content": [{"type": "tool_use", "id": "call_1", "name": "get_weather",
                                                             "input": {"city": "Paris"}}]},
                          {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "call_1",
                                                        "content": "{\"temp\": 21}"}]}])
        with live.client() as http:
            native = http.post("/generate", json={"input_ids": want, "sampling_params": {
                "max_new_tokens": 6, "temperature": 0}}).json()
        live.wait_idle()
    assert response.usage.input_tokens == len(want)
    assert response.output_text == native["text"]
    usage = message.usage  # Anthropic's input_tokens leave out what the cache read (the responses call's prefix)
    assert usage.input_tokens + (usage.cache_read_input_tokens or 0) + (usage.cache_creation_input_tokens or 0) \
        == len(want)
    assert "".join(block.text for block in message.content if block.type == "text") == native["text"]
