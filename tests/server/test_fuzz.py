"""Property-based fuzz of the native, OpenAI and program request bodies: sensible values mixed with hostile ones
(lone surrogates, inf / nan, 2^70, wrong types, unknown fields). Whatever the body, the answer is no
5xx, /health stays 200, and afterwards the KV invariant holds with nothing left running."""
from __future__ import annotations

import json

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

SETTINGS = settings(max_examples=50, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

HOSTILE_NUMBERS = st.sampled_from([-1, 0, -(2**63), 2**63, 2**64, 2**70, 10**9, 1e308, -1e308, float("inf"),
                                   float("-inf"), float("nan"), 0.5, True])
LONE_SURROGATES = st.text(st.characters(categories=["Cs", "L", "N", "Z"]), min_size=1, max_size=6).filter(
    lambda t: any("\ud800" <= c <= "\udfff" for c in t)) | st.sampled_from(["\ud800", "a\udfffb"])
TEXT = st.one_of(st.text(max_size=12), st.text(max_size=12), LONE_SURROGATES,
                 st.sampled_from(["", "\x00", "é" * 3, "<|im_end|>", " " * 40]))
HOSTILE = st.none() | st.booleans() | HOSTILE_NUMBERS | LONE_SURROGATES | st.lists(st.integers(-3, 3), max_size=3) \
    | st.just({"a": 1}) | st.lists(LONE_SURROGATES, min_size=1, max_size=2)


@st.composite
def bodies(draw, sensible: dict[str, st.SearchStrategy], required: tuple[str, ...] = (), hostile: int = 2) -> dict:
    """A body of sensible fields (`required` ones always), then up to `hostile` fields swapped for (or
    added as) hostile values: lone surrogates, inf / nan, 2^70, wrong types, unknown names."""
    body = draw(st.fixed_dictionaries({k: sensible[k] for k in required},
                                      optional={k: v for k, v in sensible.items() if k not in required}))
    for _ in range(draw(st.integers(0, hostile))):
        body[draw(st.sampled_from([*sensible, "colour"]))] = draw(HOSTILE)
    return body


SCHEMAS = st.sampled_from([{"type": 7}, {"type": "string", "maxLength": 3}, {"type": "integer"}, {"enum": []},
                           {"type": "object", "properties": {"a": {"type": "boolean"}}, "required": ["a"]},
                           {"$ref": "#/nowhere"}, {"type": "string", "pattern": "\ud800"}])
SAMPLING = {  # engine (native) names; cheap when sensible: a few tokens
    "max_new_tokens": st.integers(0, 4),
    "min_new_tokens": st.integers(0, 2),
    "temperature": st.floats(0, 2),
    "top_p": st.floats(0.01, 1),
    "top_k": st.integers(-1, 50),
    "min_p": st.floats(0, 1),
    "frequency_penalty": st.floats(-2, 2),
    "presence_penalty": st.floats(-2, 2),
    "repetition_penalty": st.floats(0.5, 2),
    "n": st.integers(1, 3),
    "seed": st.integers(0, 2**32),
    "stop": TEXT | st.lists(TEXT, max_size=2),
    "stop_token_ids": st.lists(st.integers(0, 49_151), max_size=2),
    "ignore_eos": st.booleans(),
    "skip_special_tokens": st.booleans(),
}
CONSTRAINTS = {  # at most one per request (each is costly to compile)
    "regex": st.sampled_from(["[a-z]{1,3}", "(", "\ud800", "a|b", ""]),
    "json_schema": SCHEMAS.map(json.dumps) | SCHEMAS,
    "grammar": st.sampled_from(['start: "a" | "b"', "start: ", "not a grammar"]),
}


def with_constraint(fields: dict[str, st.SearchStrategy], names: dict[str, str]) -> st.SearchStrategy:
    """Bodies of `fields`, some with one constrained-decoding field (named by `names`)."""
    plain = bodies(fields)
    return plain | st.tuples(plain, st.sampled_from(sorted(names))).flatmap(
        lambda pair: CONSTRAINTS[pair[1]].map(lambda spec: pair[0] | {names[pair[1]]: spec}))


PROMPT_IDS = st.lists(st.integers(0, 49_151), min_size=1, max_size=6)
NATIVE_OPTIONS = {
    "sampling_params": with_constraint(SAMPLING, {k: k for k in CONSTRAINTS}),
    "return_logprob": st.booleans(),
    "logprob_start_len": st.integers(-1, 4),
    "top_logprobs_num": st.integers(0, 3),
    "return_text_in_logprobs": st.booleans(),
    "stream": st.booleans(),
    "rid": st.text(min_size=1, max_size=8),
}
NATIVE = bodies(NATIVE_OPTIONS | {"text": TEXT | st.lists(TEXT, min_size=1, max_size=3)}, ("text",)) \
    | bodies(NATIVE_OPTIONS | {"input_ids": PROMPT_IDS | st.lists(PROMPT_IDS, min_size=1, max_size=3)}, ("input_ids",))

OPENAI_NAMES = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
OPENAI_SAMPLING = {OPENAI_NAMES.get(k, k): v for k, v in SAMPLING.items()} | {
    "stream": st.booleans(),
    "user": TEXT,
}
OPENAI_EXTRA = {  # fields whose sensible values are often refused too
    "model": st.sampled_from(["default", "gpt-4"]),
    "stream_options": st.sampled_from([{"include_usage": True}, {"include_usage": 3}]),
    "response_format": st.sampled_from([{"type": "json_object"}, {"type": "text"}, {"type": "json_schema"}])
    | SCHEMAS.map(lambda s: {"type": "json_schema", "json_schema": {"name": "x", "schema": s}}),
    "logit_bias": st.just({"5": 1.0}),
}
MESSAGE = bodies({"role": st.sampled_from(["user", "system", "assistant", "tool"]),
                  "content": TEXT | st.just([{"type": "text", "text": "hi"}]) | st.just([{"type": "image_url"}]),
                  "name": st.text(min_size=1, max_size=4)}, ("role",))
OPENAI_CONSTRAINTS = {"regex": "regex", "grammar": "grammar"}
COMPLETION = with_constraint(OPENAI_SAMPLING | {
    "prompt": TEXT | st.lists(TEXT, min_size=1, max_size=3) | PROMPT_IDS | st.lists(PROMPT_IDS, min_size=1, max_size=2),
    "logprobs": st.integers(0, 3),
    "echo": st.booleans(),
}, OPENAI_CONSTRAINTS) | bodies(OPENAI_EXTRA)
CHAT = with_constraint(OPENAI_SAMPLING | {
    "messages": st.lists(MESSAGE, min_size=1, max_size=3),
    "logprobs": st.booleans(),
    "top_logprobs": st.integers(0, 3),
    "max_completion_tokens": st.integers(0, 4),
}, OPENAI_CONSTRAINTS) | bodies(OPENAI_EXTRA)


NAMES = st.sampled_from(["a", "b", "c"])
STATES = st.sampled_from([0] * 6 + [1, 2, 7])  # a fork below makes states 1 and 2
OP_FIELDS = [  # (fields, required): each op kind
    ({"op": st.just("text"), "value": TEXT}, ("op", "value")),
    ({"op": st.just("gen"), "name": NAMES, "params": bodies({
        "max_tokens": st.integers(0, 3), "temperature": st.floats(0, 2), "stop": TEXT, "top_k": st.integers(-1, 9),
        "ignore_eos": st.booleans()}, ("max_tokens",), hostile=1)}, ("op", "name", "params")),
    ({"op": st.just("var"), "name": NAMES, "source": STATES}, ("op", "name")),
    ({"op": st.just("select"), "name": NAMES, "choices": st.lists(TEXT, min_size=1, max_size=3)},
     ("op", "name", "choices")),
    ({"op": st.just("role_begin"), "role": st.sampled_from(["system", "user", "assistant", "robot"])}, ("op", "role")),
    ({"op": st.just("role_end"), "role": st.sampled_from(["system", "user", "assistant"])}, ("op", "role")),
    ({"op": st.just("fork"), "size": st.just(2), "children": st.just([1, 2])}, ("op", "size", "children")),
    ({"op": st.just("join"), "children": st.just([1, 2]), "mode": st.sampled_from(["gather_variable",
                                                                                   "concate_and_append", "merge"])},
     ("op", "children", "mode")),
    ({"op": st.just("set_var"), "name": NAMES, "value": TEXT | st.integers()}, ("op", "name", "value")),
    ({"op": st.just("arg"), "name": NAMES}, ("op", "name")),
]
OP = st.one_of(  # mostly well-formed ops; a hostile field in one now and then
    *(bodies(fields, required, hostile=0) for fields, required in OP_FIELDS * 3),
    *(bodies(fields, required, hostile=1) for fields, required in OP_FIELDS))
OPS = st.lists(st.tuples(STATES, OP).map(lambda so: {"state": so[0]} | so[1]), max_size=7)
ARGS = st.sampled_from([([], {}), ([], {}), (["a"], {"a": "x"}), (["a"], {"a": ["p", "q"]}), (["a"], {}),
                        ([], {"b": 1})])  # (params, args): mostly matching
PROGRAM = st.tuples(ARGS, OPS).flatmap(lambda pair: bodies({
    "program": bodies({"version": st.just(1), "name": st.just("fuzzed"), "params": st.just(pair[0][0]),
                       "ops": st.just(pair[1])}, ("version", "name", "params", "ops"), hostile=1),
    "args": st.just(pair[0][1]),
    "sampling_params": bodies({"max_new_tokens": st.integers(0, 3), "temperature": st.floats(0, 2)}, hostile=1),
    "stream": st.booleans(),
}, ("program",), hostile=1))


def _post(http: httpx.Client, path: str, body: dict) -> None:
    """Sends `body` (Python's json: surrogate escapes, Infinity, NaN allowed) and checks the answer."""
    content = json.dumps(body)
    with http.stream("POST", path, content=content, headers={"content-type": "application/json"}) as r:
        text = r.read().decode()
    assert r.status_code < 500, f"{r.status_code} for {content}: {text}"
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        for line in text.splitlines():
            if line.startswith("data: {"):
                error = json.loads(line[6:]).get("error")
                assert not isinstance(error, dict) or error["code"] < 500, f"{line} for {content}"
    assert http.get("/health").status_code == 200


@pytest.fixture(scope="module")
def fuzzed(live_server):
    """The module's server; once the fuzz is done it must be idle, its KV accounted for."""
    yield live_server
    live_server.wait_idle()


@SETTINGS
@given(body=NATIVE)
def test_native_generate_never_answers_5xx(fuzzed, body):
    params = body.get("sampling_params", {})
    if isinstance(params, dict):  # a few tokens unless the body says otherwise (128 by default)
        body["sampling_params"] = {"max_new_tokens": 4} | params
    with fuzzed.client() as http:
        _post(http, "/generate", body)


@SETTINGS
@given(body=COMPLETION)
def test_openai_completions_never_answer_5xx(fuzzed, body):
    with fuzzed.client() as http:
        _post(http, "/v1/completions", {"model": "default", "prompt": "x", "max_tokens": 4} | body)


@SETTINGS
@given(body=CHAT)
def test_openai_chat_completions_never_answer_5xx(fuzzed, body):
    with fuzzed.client() as http:
        base = {"model": "default", "messages": [{"role": "user", "content": "x"}], "max_tokens": 4}
        _post(http, "/v1/chat/completions", base | body)


@SETTINGS
@given(body=PROGRAM)
def test_programs_never_answer_5xx(fuzzed, body):
    with fuzzed.client() as http:
        _post(http, "/v1/programs", body)


def test_the_fuzzed_server_is_idle_and_its_kv_accounted_for(fuzzed):
    stats = fuzzed.wait_idle()
    assert stats["finished_requests_total"] > 0  # the fuzz did run requests, not only refuse them
