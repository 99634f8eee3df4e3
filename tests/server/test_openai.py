"""The OpenAI-compatible routes, driven by the official `openai` client; the engine is the oracle."""
from __future__ import annotations

import dataclasses
import json
import threading

import openai
import pytest

from radixlang.runtime.sampling_params import SamplingParams
from radixlang.runtime.validation import check_params, parse_params
from radixlang.server.errors import APIError
from radixlang.server.openai_api import sampling_params
from radixlang.server.protocol import ChatCompletionRequest, CompletionRequest

MESSAGES = [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name a color."}]


@pytest.fixture
def client(server):
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=60) as c:
        yield c


def chat_ids(engine, messages=MESSAGES) -> list[int]:
    return engine.tokenizer.encode(engine.tokenizer.apply_chat_template(messages))


# ---- /v1/completions ------------------------------------------------------------------------------
def test_completion_matches_the_engines_greedy_output(server, client):
    expected = server.engine.generate("Hello world", {"temperature": 0, "max_new_tokens": 8})
    out = client.completions.create(model="default", prompt="Hello world", max_tokens=8, temperature=0)
    assert out.object == "text_completion" and out.id.startswith("cmpl-") and out.model == "default"
    assert out.choices[0].text == expected.text and out.choices[0].finish_reason == "length"
    n_prompt = len(server.engine.tokenizer.encode("Hello world"))
    assert (out.usage.prompt_tokens, out.usage.completion_tokens, out.usage.total_tokens) == (n_prompt, 8, n_prompt + 8)


def test_completion_default_max_tokens_is_openais_16(server, client):
    out = client.completions.create(model="default", prompt="Hello", temperature=0, extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 16


def test_completion_batch_with_n_orders_choices_prompt_major_and_counts_each_prompt_once(server, client):
    prompts = ["one two", "three four five"]
    params = {"temperature": 0.9, "n": 2, "seed": 3, "max_new_tokens": 6}
    expected = server.engine.generate(prompts, params)
    out = client.completions.create(model="default", prompt=prompts, n=2, seed=3, temperature=0.9, max_tokens=6)
    assert [c.index for c in out.choices] == [0, 1, 2, 3]
    assert [c.text for c in out.choices] == [e.text for e in expected]
    assert out.usage.prompt_tokens == sum(len(server.engine.tokenizer.encode(p)) for p in prompts)
    assert out.usage.completion_tokens == sum(len(e.output_ids) for e in expected)


def test_completion_prompt_as_token_ids_matches_the_text_prompt(server, client):
    ids = server.engine.tokenizer.encode("Hello world")
    by_ids = client.completions.create(model="default", prompt=ids, max_tokens=6, temperature=0)
    by_text = client.completions.create(model="default", prompt="Hello world", max_tokens=6, temperature=0)
    assert by_ids.choices[0].text == by_text.choices[0].text


def test_completion_echo_with_logprobs_scores_prompt_and_output(server, client):
    tok, prompt = server.engine.tokenizer, "The quick brown fox"
    ids = tok.encode(prompt)
    expected = server.engine.generate(prompt, {"temperature": 0, "max_new_tokens": 4}, return_logprob=True,
                                      logprob_start_len=0, top_logprobs_num=2)
    out = client.completions.create(model="default", prompt=prompt, max_tokens=4, temperature=0, echo=True,
                                    logprobs=2)
    choice = out.choices[0]
    choice_lp = choice.logprobs
    assert choice.text == prompt + expected.text
    assert choice_lp.tokens == [tok.decode([t]) for t in ids + expected.output_ids]
    assert choice_lp.token_logprobs[0] is None and choice_lp.top_logprobs[0] is None
    scored = expected.meta.input_logprobs + expected.meta.output_logprobs
    assert choice_lp.token_logprobs[1:] == pytest.approx([lp.logprob for lp in scored])
    assert all(len(top) <= 2 for top in choice_lp.top_logprobs[1:])
    for token, offset in zip(choice_lp.tokens, choice_lp.text_offset):  # offsets index the choice's text
        assert choice.text[offset: offset + len(token)] == token


def test_completion_with_zero_max_tokens_and_echo_scores_only_the_prompt(server, client):
    prompt = "Scoring a sentence like an evaluation harness does"
    out = client.completions.create(model="default", prompt=prompt, max_tokens=0, echo=True, logprobs=0)
    lp = out.choices[0].logprobs
    assert out.choices[0].text == prompt and out.choices[0].finish_reason == "length"
    assert len(lp.tokens) == len(server.engine.tokenizer.encode(prompt)) and out.usage.completion_tokens == 0
    assert lp.token_logprobs[0] is None and all(v < 0 for v in lp.token_logprobs[1:])


def test_completion_stream_with_n_joins_to_the_non_streaming_choices(server, client):
    args = dict(model="default", prompt="Once upon", n=2, seed=11, temperature=0.8, max_tokens=8)
    whole = client.completions.create(**args)
    texts = {0: "", 1: ""}
    finish = {}
    for chunk in client.completions.create(**args, stream=True):
        for c in chunk.choices:
            texts[c.index] += c.text
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
    assert texts == {c.index: c.text for c in whole.choices}
    assert finish == {0: "length", 1: "length"}


def test_completion_stop_sequence_trims_and_reports_it(server, client):
    full = server.engine.generate("Hello world", {"temperature": 0, "max_new_tokens": 16}).text
    stop = full[6:9]
    out = client.completions.create(model="default", prompt="Hello world", max_tokens=16, temperature=0, stop=stop)
    assert out.choices[0].text == full[: full.index(stop)]
    assert out.choices[0].finish_reason == "stop" and out.choices[0].model_extra["matched_stop"] == stop


# ---- /v1/chat/completions -------------------------------------------------------------------------
def test_chat_applies_the_models_chat_template(server, client):
    ids = chat_ids(server.engine)
    expected = server.engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 10})
    out = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=10, temperature=0)
    assert out.object == "chat.completion" and out.id.startswith("chatcmpl-")
    assert out.choices[0].message.role == "assistant" and out.choices[0].message.content == expected.text
    assert out.usage.prompt_tokens == len(ids) and out.usage.completion_tokens == len(expected.output_ids)


def test_chat_text_content_parts_are_joined_like_a_string(server, client):
    parts = [{"role": "user", "content": [{"type": "text", "text": "Name"}, {"type": "text", "text": "a color."}]}]
    joined = [{"role": "user", "content": "Name\na color."}]
    a = client.chat.completions.create(model="default", messages=parts, max_tokens=6, temperature=0)
    b = client.chat.completions.create(model="default", messages=joined, max_tokens=6, temperature=0)
    assert a.choices[0].message.content == b.choices[0].message.content


def test_chat_max_completion_tokens_wins_over_max_tokens(server, client):
    out = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=9, max_completion_tokens=3,
                                         extra_body={"ignore_eos": True})
    assert out.usage.completion_tokens == 3


def test_chat_stream_deltas_join_to_the_whole_message_with_usage_last(server, client):
    whole = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=12, temperature=0)
    chunks = list(client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=12, temperature=0,
                                                 stream=True, stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == whole.choices[0].message.content
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == whole.choices[0].finish_reason
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == whole.usage.completion_tokens
    assert all(c.usage is None for c in chunks[:-1])


def test_chat_logprobs_report_the_sampled_tokens_with_their_alternatives(server, client):
    ids = chat_ids(server.engine)
    expected = server.engine.generate(input_ids=ids, sampling_params={"temperature": 0, "max_new_tokens": 6},
                                      return_logprob=True, top_logprobs_num=3)
    out = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=6, temperature=0,
                                         logprobs=True, top_logprobs=3)
    content = out.choices[0].logprobs.content
    assert [c.logprob for c in content] == pytest.approx([lp.logprob for lp in expected.meta.output_logprobs])
    assert [bytes(c.bytes) for c in content] == [server.engine.tokenizer.token_bytes[t] for t in expected.output_ids]
    for c in content:
        assert len(c.top_logprobs) == 3 and c.top_logprobs[0].token == c.token  # greedy took the best


def test_chat_stream_with_n_gives_each_choice_its_role_and_finish(server, client):
    finishes, roles = {}, set()
    for chunk in client.chat.completions.create(model="default", messages=MESSAGES, n=3, max_tokens=4, seed=1,
                                                stream=True):
        for c in chunk.choices:
            if c.delta.role:
                roles.add(c.index)
            if c.finish_reason:
                finishes[c.index] = c.finish_reason
    assert roles == {0, 1, 2} and set(finishes) == {0, 1, 2}


def test_models_lists_the_served_model(server, client):
    models = client.models.list().data
    assert [m.id for m in models] == [server.engine.model_name]
    out = client.completions.create(model=server.engine.model_name, prompt="x", max_tokens=1)
    assert out.model == server.engine.model_name


def test_abort_by_response_id_ends_an_openai_stream(server, client):
    stream = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=900, stream=True,
                                            extra_body={"ignore_eos": True})
    first = next(iter(stream))
    import httpx

    assert httpx.post(f"{server.url}/abort", json={"rid": first.id}).json() == {"aborted": 1}
    last = [c for c in stream if c.choices][-1]
    assert last.choices[0].finish_reason == "abort"


# ---- errors ---------------------------------------------------------------------------------------
@pytest.mark.parametrize("kwargs, param, words", [
    (dict(max_tokens=-1), "max_tokens", "max_tokens must be in [0,"),
    (dict(temperature=-1.0), "temperature", "temperature must be in"),
    (dict(top_p=1.5), "top_p", "top_p must be in"),
    (dict(n=0), "n", "n must be in"),
    (dict(n=10**9), "n", "n must be in"),
    (dict(logprobs=21), "logprobs", "[0, 20]"),
    (dict(logit_bias={"1": 500}), "logit_bias", "must be a number in [-100.0, 100.0]"),
    (dict(best_of=3), "best_of", "not supported"),
    (dict(suffix="end"), "suffix", "not supported"),
    (dict(stop=[""]), "stop", "non-empty"),
    (dict(prompt=[]), "prompt", "must not be empty"),
    (dict(prompt=[10**9]), "prompt", "token ids in"),
    (dict(stream_options={"include_usage": True}), "stream_options", "stream=true"),
    (dict(extra_body={"bogus": 1}), "bogus", "unknown field"),
    (dict(extra_body={"regex": "a", "grammar": "start: 'a'"}), "grammar", "at most one"),
    (dict(extra_body={"min_tokens": 5}), "min_tokens", "min_tokens must be in [0, 2], got 5"),
    (dict(extra_body={"stop_token_ids": [10**9]}), "stop_token_ids", "stop_token_ids must be token ids in [0, "),
])
def test_completion_bad_requests_are_400s_naming_the_field(server, client, kwargs, param, words):
    args = dict(model="default", prompt="x", max_tokens=2) | kwargs
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(**args)
    assert e.value.param == param and words in e.value.message and e.value.type == "invalid_request_error"


@pytest.mark.parametrize("kwargs, param, words", [
    (dict(max_completion_tokens=-3), "max_completion_tokens", "must be in"),
    (dict(max_completion_tokens=3, extra_body={"min_tokens": 4}), "min_tokens", "min_tokens must be in [0, 3], got 4"),
    (dict(top_logprobs=2), "top_logprobs", "logprobs=true"),
    (dict(logprobs=True, top_logprobs=50), "top_logprobs", "[0, 20]"),
    (dict(messages=[]), "messages", "at least 1"),
    (dict(messages=[{"role": "wizard", "content": "hi"}]), "messages[0].role", "Input should be"),
    (dict(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages[0].content[0]", "only text content parts"),
    (dict(tools=[{"type": "function", "function": {"name": "f"}}], tool_choice="maybe"), "tool_choice", "maybe"),
    (dict(response_format={"type": "json_schema"}), "response_format", "json_schema is required"),
])
def test_chat_bad_requests_are_400s_naming_the_field(server, client, kwargs, param, words):
    args = dict(model="default", messages=MESSAGES, max_tokens=2) | kwargs
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**args)
    assert e.value.param == param and words in e.value.message


def test_an_unknown_model_is_a_404(server, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=MESSAGES, max_tokens=2)
    assert e.value.param == "model" and server.engine.model_name in e.value.message


def test_an_engine_failure_is_a_500_and_the_next_request_succeeds(server, client, monkeypatch):
    runner = server.engine.runner
    real = runner.forward

    def fail_once(chunks):
        monkeypatch.setattr(runner, "forward", real)
        raise RuntimeError("injected failure")

    monkeypatch.setattr(runner, "forward", fail_once)
    with pytest.raises(openai.InternalServerError) as e:
        client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=4)
    assert "injected failure" in e.value.message
    server.wait_idle()
    assert client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=4).choices[0].message


# ---- constrained decoding: the mapping now; end to end once the engine has the fields ----------------
def test_response_format_maps_to_the_json_schema_sampling_param():
    schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema}}})
    assert json.loads(sampling_params(req, 5)["json_schema"]) == schema
    assert "json_schema_strict" not in sampling_params(req, 5)  # the schema's own semantics
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, "response_format": {
        "type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}})
    params = sampling_params(req, 5)
    assert params["json_schema_strict"] is True  # OpenAI's strict: declared order, closed objects
    assert parse_params(params).constraint == ("json_schema_strict", params["json_schema"])
    with pytest.raises(ValueError):  # set by response_format only
        ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES, "json_schema_strict": True})
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES,
                                                "response_format": {"type": "json_object"}})
    assert json.loads(sampling_params(req, 5)["json_schema"]) == {"type": "object"}
    req = ChatCompletionRequest.model_validate({"model": "m", "messages": MESSAGES,
                                                "response_format": {"type": "text"}})
    assert "json_schema" not in sampling_params(req, 5)


def test_regex_and_grammar_extensions_map_to_sampling_params():
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "regex": "[ab]+"})
    assert sampling_params(req, 5)["regex"] == "[ab]+"
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "grammar": "start: \"a\""})
    assert sampling_params(req, 5)["grammar"] == "start: \"a\""
    req = CompletionRequest.model_validate({"model": "m", "prompt": "x", "regex": "a",
                                            "response_format": {"type": "json_object"}})
    with pytest.raises(APIError, match="at most one"):
        sampling_params(req, 5)


def test_openai_names_map_to_the_engines_sampling_params():
    req = CompletionRequest.model_validate({
        "model": "m", "prompt": "x", "temperature": 0.5, "top_p": 0.9, "n": 2, "stop": "\n", "seed": 4,
        "frequency_penalty": 0.1, "presence_penalty": 0.2, "top_k": 5, "min_p": 0.05, "repetition_penalty": 1.1,
        "min_tokens": 2, "stop_token_ids": [7], "ignore_eos": True, "skip_special_tokens": False,
        "no_stop_trim": True})
    params = sampling_params(req, 30)
    assert params == {"max_new_tokens": 30, "n": 2, "temperature": 0.5, "top_p": 0.9, "stop": "\n", "seed": 4,
                      "frequency_penalty": 0.1, "presence_penalty": 0.2, "top_k": 5, "min_p": 0.05,
                      "repetition_penalty": 1.1, "min_new_tokens": 2, "stop_token_ids": [7], "ignore_eos": True,
                      "skip_special_tokens": False, "no_stop_trim": True}
    check_params(parse_params(params), 100, 100)  # every name is one the engine knows


constrained = pytest.mark.skipif(
    not {"json_schema", "regex", "grammar"} <= {f.name for f in dataclasses.fields(SamplingParams)},
    reason="constrained decoding (json_schema / regex / grammar) is not in this engine yet")


@constrained
def test_response_format_json_schema_constrains_the_chat_reply(server, client):
    schema = {"type": "object", "properties": {"color": {"enum": ["red", "green", "blue"]}},
              "required": ["color"], "additionalProperties": False}
    out = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=64, temperature=0,
                                         response_format={"type": "json_schema",
                                                          "json_schema": {"name": "c", "schema": schema}})
    assert out.choices[0].finish_reason == "stop"
    assert json.loads(out.choices[0].message.content)["color"] in {"red", "green", "blue"}


@constrained
def test_response_format_json_object_gives_a_json_object(server, client):
    out = client.chat.completions.create(model="default", messages=MESSAGES, max_tokens=128, temperature=0,
                                         response_format={"type": "json_object"})
    if out.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(out.choices[0].message.content), dict)
    else:  # a random model may ramble inside the object until the limit; what it wrote is still a prefix
        assert out.choices[0].message.content.lstrip().startswith("{")


@constrained
def test_regex_extension_constrains_the_completion(server, client):
    import re

    out = client.completions.create(model="default", prompt="Answer:", max_tokens=16, temperature=0,
                                    extra_body={"regex": "(yes|no)[.!]"})
    assert re.fullmatch(r"(yes|no)[.!]", out.choices[0].text)


@constrained
def test_grammar_extension_constrains_the_completion(server, client):
    import lark

    grammar = 'start: "(" NUMBER ("+" NUMBER)* ")"\nNUMBER: /[0-9]/'
    out = client.completions.create(model="default", prompt="Sum:", max_tokens=24, temperature=0,
                                    extra_body={"grammar": grammar})
    if out.choices[0].finish_reason == "stop":
        lark.Lark(grammar).parse(out.choices[0].text)
    else:
        assert out.choices[0].text.startswith("(")


def test_concurrent_streams_on_one_connection_pool_do_not_mix(server, client):
    """Each thread streams its own prompt; every result must equal that prompt's own greedy text."""
    prompts = [f"Story number {i}:" for i in range(6)]
    expected = {p: server.engine.generate(p, {"temperature": 0, "max_new_tokens": 10}).text for p in prompts}
    got: dict[str, str] = {}

    def run(p: str) -> None:
        text = "".join(c.choices[0].text for c in client.completions.create(
            model="default", prompt=p, max_tokens=10, temperature=0, stream=True) if c.choices)
        got[p] = text

    threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert got == expected


def test_sampling_fields_declaration_matches_the_built_model():
    """The type checker's SamplingFields (declared under TYPE_CHECKING) names the same fields, with the same
    types, as the pydantic model create_model builds from the runtime's schema."""
    import ast
    import typing
    from pathlib import Path

    from radixlang.server import protocol

    tree = ast.parse(Path(protocol.__file__).read_text())
    declared = next(node for node in ast.walk(tree) if isinstance(node, ast.ClassDef) and node.name == "SamplingFields")
    hints = {s.target.id: eval(ast.unparse(s.annotation), vars(protocol) | vars(typing))  # noqa: S307 - our own source
             for s in declared.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)}
    built = {name: kind for name, (kind, _) in protocol._sampling_fields().items()}
    assert hints == built
