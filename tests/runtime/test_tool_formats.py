"""Tool-call formats: each family's parser reads its chat template's own rendering of the same calls
(rendered by transformers, the oracle), and the constraint's output for each format parses into calls
whose arguments validate (jsonschema)."""
from __future__ import annotations

import json
import random

import pytest

from radixlang.runtime.tool_formats import (
    FALLBACK,
    HERMES,
    LLAMA3_JSON,
    MISTRAL,
    ToolCall,
    detect_format,
    fallback_messages,
    held_back,
    parse_tool_calls,
    render_call,
    tool_call_structural_tag,
)

from .constrained.conftest import compiler, vocab  # noqa: F401 (fixtures)
from .constrained.test_structural_tag import tagged_walk
from .models.hf_tiny import write_tokenizer
from .models.test_chat_templates import LLAMA31, QWEN25

transformers = pytest.importorskip("transformers")
jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the oracle for the arguments")

# after Mistral's v3 template: tools before the last user turn, calls as one JSON array with 9-character ids
MISTRAL_TOOLS = """{%- if not tools is defined %}{%- set tools = none %}{%- endif %}
{{- bos_token }}
{%- for message in messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and loop.last %}
            {{- "[AVAILABLE_TOOLS] [" }}
            {%- for tool in tools %}{{- tool | tojson }}{%- if not loop.last %}{{- ", " }}{%- endif %}{%- endfor %}
            {{- "][/AVAILABLE_TOOLS]" }}
        {%- endif %}
        {{- "[INST] " + message["content"] + "[/INST]" }}
    {%- elif message.tool_calls is defined and message.tool_calls is not none %}
        {{- "[TOOL_CALLS] [" }}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.id is not defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- '{"name": "' + tool_call.function.name + '", "arguments": ' + tool_call.function.arguments|tojson }}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}{{- ", " }}{%- endif %}
        {%- endfor %}
        {{- "]" + eos_token }}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"] + eos_token }}
    {%- elif message["role"] == "tool" %}
        {{- '[TOOL_RESULTS] {"content": ' + message.content|tojson + ', "call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- endif %}
{%- endfor %}
"""
WEATHER = {"name": "get_weather", "description": "Weather in a city.", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "maxLength": 10}, "days": {"type": "integer", "minimum": 1,
                                                                                         "maximum": 7}},
    "required": ["city", "days"], "additionalProperties": False}}
ADD = {"name": "add", "description": "Adds.", "parameters": {
    "type": "object", "properties": {"a": {"type": "number"}, "b": {"type": "number"}}, "required": ["a", "b"]}}
TOOLS = [WEATHER, ADD]
CALLS = [ToolCall("get_weather", {"city": "Zürich \"old\"", "days": 3}, "abcDEF123"),
         ToolCall("add", {"a": 1.5, "b": -2}, "xyz789QRS")]
FAMILIES = {  # template, bos, eos, expected format, how many calls its template renders in one turn
    "qwen2.5": (QWEN25, "<|endoftext|>", "<|im_end|>", HERMES, 2),
    "llama3.1": (LLAMA31, "<|begin_of_text|>", "<|eot_id|>", LLAMA3_JSON, 1),
    "mistral": (MISTRAL_TOOLS, "<s>", "</s>", MISTRAL, 2),
}


def openai_calls(calls: list[ToolCall]) -> list[dict]:
    return [{"id": c.id, "type": "function", "function": {"name": c.name, "arguments": c.arguments}} for c in calls]


@pytest.mark.parametrize("family", list(FAMILIES))
def test_each_format_parses_its_templates_own_rendering_of_the_calls(tmp_path, family):
    template, bos, eos, fmt, count = FAMILIES[family]
    assert detect_format(template) is fmt
    write_tokenizer(tmp_path, bos, eos, chat_template=template)
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    tools = [{"type": "function", "function": t} for t in TOOLS]
    user = [{"role": "user", "content": "Weather in Zürich, and 1.5 + -2?"}]
    calls = CALLS[:count]
    content = "Let me check." if family == "qwen2.5" else ""
    turn = {"role": "assistant", "content": content, "tool_calls": openai_calls(calls)}
    prefix = hf.apply_chat_template(user, tools=tools, tokenize=False, add_generation_prompt=True)
    whole = hf.apply_chat_template(user + [turn], tools=tools, tokenize=False)
    if family == "mistral":  # its template renders the tools before the last user turn only
        prefix = hf.apply_chat_template(user + [turn], tools=tools, tokenize=False)[:whole.index("[TOOL_CALLS]")]
    assert whole.startswith(prefix)
    parsed = parse_tool_calls(fmt, whole[len(prefix):])
    assert [(c.name, c.arguments) for c in parsed.calls] == [(c.name, c.arguments) for c in calls]
    assert parsed.content.strip() == content and not parsed.invalid


def test_a_template_without_tools_gets_the_fallback_and_its_rendering_parses():
    smollm2 = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content']}}{% endfor %}"
    assert detect_format(smollm2) is FALLBACK and detect_format(None) is FALLBACK
    text = "Sure." + "".join(render_call(FALLBACK, c) for c in CALLS)
    assert text.startswith('Sure.<tool_call>{"name": "get_weather", "arguments": {"city": ')
    parsed = parse_tool_calls(FALLBACK, text)
    assert parsed.content == "Sure." and [c.arguments for c in parsed.calls] == [c.arguments for c in CALLS]
    system = fallback_messages([{"role": "user", "content": "hi"}], TOOLS)[0]
    assert system["role"] == "system" and json.dumps(WEATHER) in system["content"]


def test_a_call_that_does_not_parse_leaves_the_text_as_content():
    text = 'I will call <tool_call>{"name": "add", "arguments": {"a": 1'
    parsed = parse_tool_calls(HERMES, text)
    assert parsed.content == text and not parsed.calls and parsed.invalid
    assert held_back(HERMES, "hello <tool_") == len("<tool_") and held_back(HERMES, "hello") == 0


@pytest.mark.parametrize("fmt", [HERMES, LLAMA3_JSON, MISTRAL, FALLBACK], ids=lambda f: f.name)
@pytest.mark.parametrize("choice", ["required", "auto"])
def test_constrained_outputs_of_each_format_parse_into_valid_calls(compiler, fmt, choice):
    constraint = compiler.compile("structural_tag", tool_call_structural_tag(fmt, TOOLS, choice, parallel=True))
    schemas = {t["name"]: t["parameters"] for t in TOOLS}
    rng = random.Random(1)
    found = 0
    for _ in range(20):
        data, complete = tagged_walk(constraint, fmt.trigger.encode(), rng, max_tokens=250)
        if not complete:
            continue
        parsed = parse_tool_calls(fmt, data.decode())
        assert not parsed.invalid
        if choice == "required":
            assert parsed.calls and not parsed.content.strip()
        for call in parsed.calls:
            jsonschema.validate(call.arguments, schemas[call.name])
        found += len(parsed.calls)
    assert found >= 3


@pytest.mark.parametrize("family", ["qwen2.5", "mistral"])
def test_special_token_markers_are_allowed_as_tokens_and_kept_for_the_parser(tmp_path, family):
    """A format whose markers are special tokens in the vocabulary (Mistral's [TOOL_CALLS]; Qwen's
    <tool_call> / </tool_call> where a vocabulary marks them special, as GGUF's and this byte tokenizer
    do): the constraint allows each token where its text may come and nowhere else, and the template's
    own rendering of the calls, as token ids, reads back into the calls through the detokenizer the
    engine gives such a request."""
    import torch

    from radixlang.runtime.constrained.compiler import ConstraintCompiler
    from radixlang.runtime.constrained.masks.vocab import TokenVocab
    from radixlang.runtime.engine import create_req
    from radixlang.runtime.sampling_params import SamplingParams
    from radixlang.runtime.tokenizer import Tokenizer

    template, bos, eos, fmt, count = FAMILIES[family]
    write_tokenizer(tmp_path, bos, eos, chat_template=template)
    ours, hf = Tokenizer.from_hf_dir(tmp_path), transformers.AutoTokenizer.from_pretrained(str(tmp_path))
    vocab = TokenVocab.from_tokenizer(ours, ours.vocab_size)
    compiler = ConstraintCompiler(lambda: vocab)
    trigger = ours.hf.token_to_id(fmt.trigger)
    assert trigger in ours.special_token_ids and trigger not in vocab.ids

    auto = compiler.compile("structural_tag", tool_call_structural_tag(fmt, TOOLS, "auto"))
    start = auto.advance_bytes(auto.initial(), b"Let me see. ")
    assert auto.allowed(start)[trigger] and auto.advance(start, trigger) == auto.advance_bytes(start, fmt.trigger.encode())
    inside = auto.advance(start, trigger)
    assert not auto.allowed(inside)[trigger] and auto.advance(inside, trigger) is None  # not inside a call

    required = compiler.compile("structural_tag", tool_call_structural_tag(fmt, TOOLS, "required"))
    state = required.initial()
    assert required.allowed(state)[trigger]
    if family == "qwen2.5":  # the end marker is a token too, allowed exactly where the call may end
        end = ours.hf.token_to_id("</tool_call>")
        state = required.advance(state, trigger)
        state = required.advance_bytes(state, b'\n{"name": "add", "arguments": {"a":1,"b":2')
        assert not required.allowed(state)[end]
        state = required.advance_bytes(state, b"}}\n")
        assert required.allowed(state)[end] and required.can_end(required.advance(state, end))

    turn = {"role": "assistant", "content": "", "tool_calls": openai_calls(CALLS[:count])}
    user = [{"role": "user", "content": "Weather in Zürich, and 1.5 + -2?"}]
    tools = [{"type": "function", "function": t} for t in TOOLS]
    whole = hf.apply_chat_template(user + [turn], tools=tools, tokenize=False)
    reply = whole[whole.index(fmt.trigger, whole.rindex(user[0]["content"])):whole.rindex(eos)]  # the assistant's turn
    ids = ours.encode(reply, add_special_tokens=False)
    assert trigger in ids
    req = create_req("r", [1], SamplingParams(), ours, lambda c: None, context_length=64, seed=0,
                     device=torch.device("cpu"), constraint=auto)
    text = req.detok.add(ids).delta + req.detok.flush()
    parsed = parse_tool_calls(fmt, text)
    assert [(c.name, c.arguments) for c in parsed.calls] == [(c.name, c.arguments) for c in CALLS[:count]]
    assert not parse_tool_calls(fmt, ours.decode(ids)).calls  # skipping special tokens would lose the calls


def test_an_engine_writes_the_special_token_marker_and_keeps_it_in_the_text(tmp_path):
    """End to end on a tiny model whose vocabulary makes [TOOL_CALLS] one special token, biased hard
    towards it: with "auto", the model writes it where a call may begin (never inside the call, where
    the constraint masks it), the text keeps it, and the text parses into calls valid for their schemas."""
    from radixlang.runtime.engine import Engine

    from .models.hf_tiny import BASE, save_hf_model

    save_hf_model(tmp_path, transformers.LlamaConfig(**BASE), seed=1)
    write_tokenizer(tmp_path, "<s>", "</s>", chat_template=MISTRAL_TOOLS)
    engine = Engine(model=str(tmp_path), device="cpu", kv_cache_tokens=2048)
    try:
        marker = engine.tokenizer.hf.token_to_id("[TOOL_CALLS]")
        params = {"structural_tag": tool_call_structural_tag(MISTRAL, TOOLS, "auto", parallel=False),
                  "max_new_tokens": 150, "temperature": 0.7, "logit_bias": {str(marker): 100}}
        schemas = {t["name"]: t["parameters"] for t in TOOLS}
        outs = engine.generate(["Hi", "Call add", "Weather?"], params)
        assert any(out.meta.finish_reason == "stop" for out in outs)
        for out in outs:
            assert out.output_ids[0] == marker and out.output_ids.count(marker) == 1
            assert out.text.startswith("[TOOL_CALLS]")
            if out.meta.finish_reason == "stop":
                parsed = parse_tool_calls(MISTRAL, out.text)
                assert len(parsed.calls) == 1 and not parsed.invalid
                jsonschema.validate(parsed.calls[0].arguments, schemas[parsed.calls[0].name])
        engine.check_invariants()
    finally:
        engine.shutdown()
