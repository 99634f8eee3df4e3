"""An adversarial client: every mistake it can make is a 4xx naming the field or the limit, and no
request can freeze the event loop (issue 11)."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from urllib.parse import urlsplit

import httpx
import pytest

import radixlang as rl
from radixlang.runtime.engine import Engine
from radixlang.server.launch import background_server
from radixlang.server.limits import ServerLimits

from ..conftest import OUTLASTS_GRACE_KV_TOKENS, OUTLASTS_GRACE_TOKENS
from .conftest import TEST_KEY

AUTH_LINE = f"Authorization: Bearer {TEST_KEY}\r\n".encode() if TEST_KEY else b""  # raw requests carry the suite's key

CHAT = {"model": "default", "max_tokens": 2}


def _error(r: httpx.Response, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def _post(http: httpx.Client, path: str, body: dict) -> httpx.Response:
    """POSTs `body` as Python's json writes it: lone surrogates as \\ud800 escapes, inf as Infinity,
    as a careless client would (httpx's own json= refuses both)."""
    return http.post(path, content=json.dumps(body), headers={"content-type": "application/json"})


def _raw_socket(url: str) -> socket.socket:
    parts = urlsplit(url)
    return socket.create_connection((parts.hostname, parts.port), timeout=60)


def _read_response(sock: socket.socket) -> tuple[int, dict]:
    """Status and JSON body of the one response on `sock` (the server closes the connection after it)."""
    data = b""
    while chunk := sock.recv(65536):
        data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), json.loads(body)


# ---- text the tokenizer cannot take ----------------------------------------------------------------
@pytest.mark.parametrize("path, body, param", [
    ("/generate", {"text": "a\ud800b"}, "text"),
    ("/generate", {"text": ["fine", "bad \udfff"]}, "text[1]"),
    ("/v1/completions", {"model": "default", "prompt": "\ud800"}, "prompt"),
    ("/v1/completions", {"model": "default", "prompt": ["ok", "\ud800"]}, "prompt[1]"),
    ("/generate", {"text": "hi", "sampling_params": {"stop": ["ok", "\ud800"]}}, "sampling_params.stop[1]"),
    ("/v1/completions", {"model": "default", "prompt": "hi", "stop": "\ud800"}, "stop"),
    ("/v1/chat/completions", CHAT | {"messages": [{"role": "user", "content": "hi"},
                                                  {"role": "user", "content": "x\ud800"}]}, "messages[1].content"),
    ("/v1/chat/completions", CHAT | {"messages": [{"role": "user", "content": [{"type": "text", "text": "\ud800"}]}]},
     "messages[0].content[0].text"),
])
def test_a_lone_surrogate_is_a_400_naming_the_field_and_the_connection_stays_usable(server, path, body, param):
    with server.client() as http:  # one kept-alive connection for both requests
        error = _error(_post(http, path, body), 400)
        after = http.post("/generate", json={"text": "still here", "sampling_params": {"max_new_tokens": 2}})
    assert error["param"] == param and "surrogate" in error["message"]
    assert after.status_code == 200


# ---- programs: the client's mistakes ---------------------------------------------------------------
def _ir(*ops: dict) -> dict:
    return {"version": 1, "name": "p", "params": [], "ops": [{"state": 0} | op for op in ops]}


@pytest.mark.parametrize("program", [
    _ir({"op": "text", "value": "a"}, {"op": "var", "name": "nope", "source": 0}),
    _ir({"op": "var", "name": "x", "source": 0}, {"op": "gen", "name": "x", "params": {"max_tokens": 2}}),
], ids=["undefined", "read-before-gen"])
@pytest.mark.parametrize("stream", [False, True])
def test_a_program_reading_an_undefined_variable_is_the_clients_error(server, read_sse, program, stream):
    with server.client() as http:
        if not stream:
            error = _error(http.post("/v1/programs", json={"program": program}), 400)
            assert "variable" in error["message"] and "which no earlier op" in error["message"]
            return
        with http.stream("POST", "/v1/programs", json={"program": program, "stream": True}) as r:
            events = read_sse(r)
    assert events[-2]["event"] == "error" and events[-2]["type"] == "ValueError"
    assert "which no earlier op" in events[-2]["error"]


def test_a_program_gen_with_a_negative_max_tokens_says_what_is_allowed(server):
    program = _ir({"op": "text", "value": "a"}, {"op": "gen", "name": "x", "params": {"max_tokens": -3}})
    with server.client() as http:
        error = _error(http.post("/v1/programs", json={"program": program}), 400)
    assert "max_tokens must be in [0, context_length], got -3" in error["message"]


def test_a_program_text_with_a_lone_surrogate_is_a_400(server):
    with server.client() as http:
        error = _error(_post(http, "/v1/programs", {"program": _ir({"op": "text", "value": "\ud800"})}), 400)
    assert "surrogate" in error["message"] or "encode" in error["message"]


# ---- numbers ------------------------------------------------------------------------------------------
_NATIVE = [
    ({"sampling_params": {"temperature": float("inf")}}, "sampling_params.temperature", "finite"),
    ({"sampling_params": {"temperature": 1e308}}, "sampling_params.temperature", "[0.0, 100.0]"),
    ({"sampling_params": {"top_p": float("nan")}}, "sampling_params.top_p", "finite"),
    ({"sampling_params": {"seed": 2**70}}, "sampling_params.seed", "seed must be in"),
    ({"logprob_start_len": 10**9, "return_logprob": True}, "logprob_start_len", "logprob_start_len must be in [-1,"),
]


@pytest.mark.parametrize("extra, param, words", _NATIVE)
def test_native_numbers_out_of_range_are_400s_naming_the_field(server, extra, param, words):
    with server.client() as http:
        error = _error(_post(http, "/generate", {"text": "x"} | extra), 400)
    assert error["param"] == param and words in error["message"]


@pytest.mark.parametrize("extra, param, words", [
    ({"temperature": float("inf")}, "temperature", "finite"),
    ({"temperature": 1e308}, "temperature", "[0.0, 100.0]"),
    ({"seed": 2**70}, "seed", "seed must be in"),
    ({"presence_penalty": float("-inf")}, "presence_penalty", "finite"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": 7}}}},
     "response_format", "type name or a list of them, got 7"),
])
def test_openai_numbers_and_schemas_out_of_range_are_400s_naming_the_field(server, extra, param, words):
    body = CHAT | {"messages": [{"role": "user", "content": "x"}]} | extra
    with server.client() as http:
        error = _error(_post(http, "/v1/chat/completions", body), 400)
    assert error["param"] == param and words in error["message"]


# ---- limits ---------------------------------------------------------------------------------------------
def test_a_50_mb_body_is_refused_before_it_is_read_while_health_answers(server):
    declared = 50 * 2**20
    sock = _raw_socket(server.url)
    with sock, server.client() as http:  # as curl sends a big body: headers first, the body on 100 Continue
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n" + AUTH_LINE
                     + f"Expect: 100-continue\r\nContent-Length: {declared}\r\n\r\n".encode())
        health = http.get("/health")
        status, body = _read_response(sock)  # no byte of the body was sent
    assert health.status_code == 200
    assert status == 413 and "max_body_bytes" in body["error"]["message"]
    assert str(ServerLimits().max_body_bytes) in body["error"]["message"]


def test_a_chunked_body_is_refused_once_it_crosses_the_limit(server_factory):
    server = server_factory(limits=ServerLimits(max_body_bytes=3 * 2**20))
    app, sent = server.server.config.app, []

    async def chunks():
        for i in range(10):
            sent.append(i)
            yield b'{"text": "' if i == 0 else b"a" * 2**20

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://x") as http:
            return await http.post("/generate", content=chunks(), headers={"content-type": "application/json"}
                                   | ({"authorization": f"Bearer {TEST_KEY}"} if TEST_KEY else {}))

    error = _error(asyncio.run(post()), 413)
    assert "3145728 bytes (max_body_bytes)" in error["message"]
    assert len(sent) < 10  # the rest was never read


def test_health_answers_while_huge_prompts_are_tokenised_and_then_refused(server_factory):
    """Tokenising runs on a worker thread (the tokenizer lets go of the GIL), so /health requests sent
    after the whole body is in are answered before the big request is. On the event loop, none could be."""
    server = server_factory(limits=ServerLimits(max_body_bytes=64 * 2**20))
    body = json.dumps({"text": [f"word{i} " * 60_000 for i in range(8)]}).encode()  # 4 MB, seconds to tokenise
    sock = _raw_socket(server.url)
    answer: list[tuple[int, dict]] = []
    with sock, server.client() as http:
        sock.sendall(b"POST /generate HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\n"
                     + AUTH_LINE
                     + f"Content-Length: {len(body)}\r\n\r\n".encode() + body)
        reader = threading.Thread(target=lambda: answer.append(_read_response(sock)))
        reader.start()
        answered_before = 0
        while reader.is_alive():
            assert http.get("/health").status_code == 200
            answered_before += reader.is_alive()
        reader.join()
    status, error = answer[0]
    assert status == 400 and error["error"]["param"] == "text[0]" and "context holds" in error["error"]["message"]
    assert answered_before >= 3


@pytest.mark.parametrize("path, body, param, limit", [
    ("/generate", {"text": ["p"] * 5}, "text", "max_prompts"),
    ("/generate", {"input_ids": [[1, 2]] * 5}, "input_ids", "max_prompts"),
    ("/generate", {"text": ["p"] * 3, "sampling_params": {"n": 3}}, "n", "max_sequences"),
    ("/v1/completions", {"model": "default", "prompt": ["p"] * 5}, "prompt", "max_prompts"),
    ("/v1/completions", {"model": "default", "prompt": [[1]] * 2, "n": 5}, "n", "max_sequences"),
    ("/v1/chat/completions", CHAT | {"messages": [{"role": "user", "content": "x"}], "n": 9}, "n", "max_sequences"),
])
def test_too_many_prompts_or_sequences_are_refused_naming_the_limit(server_factory, path, body, param, limit):
    server = server_factory(limits=ServerLimits(max_prompts=4, max_sequences=8))
    with server.client() as http:
        error = _error(http.post(path, json=body), 400)
    assert error["param"] == param and f"({limit})" in error["message"]


def test_the_default_limits_refuse_a_4353_state_program_before_it_runs(server):
    ops = [{"state": 0, "op": "fork", "size": 256, "children": list(range(1, 257))}]
    for child in range(1, 257):
        first = 257 + 16 * (child - 1)
        ops.append({"state": child, "op": "fork", "size": 16, "children": list(range(first, first + 16))})
    before = server.engine.stats()
    with server.client() as http:
        error = _error(http.post("/v1/programs", json={"program": {"version": 1, "name": "wide", "params": [],
                                                                   "ops": ops}}), 400)
    assert error["param"] == "program" and "4353 states" in error["message"]
    assert "at most 1024 per request (max_program_states)" in error["message"]
    assert server.engine.stats()["steps_total"] == before["steps_total"]


@rl.function
def long_story(s):
    s += "Once upon a time" + rl.gen("story", max_tokens=800, ignore_eos=True)


@rl.function
def story_outlasting_the_grace(s):
    s += "Once upon a time" + rl.gen("story", max_tokens=OUTLASTS_GRACE_TOKENS, ignore_eos=True)


@pytest.mark.parametrize("stream", [False, True])
def test_a_program_past_its_wall_time_is_cancelled_naming_the_limit(server_factory, read_sse, stream):
    server = server_factory(limits=ServerLimits(max_program_seconds=0.3))
    body = {"program": long_story.trace().to_dict(), "stream": stream}
    with server.client() as http:
        if stream:
            with http.stream("POST", "/v1/programs", json=body) as r:
                message = read_sse(r)[-2]["error"]
        else:
            error = _error(http.post("/v1/programs", json=body), 400)
            message = error["message"]
            assert error["param"] == "program"
    assert "limit of 0.3 s per request (max_program_seconds)" in message
    stats = server.wait_idle()  # its engine request was aborted and its KV returned
    assert stats["aborted_requests_total"] == 1


# ---- why a request stopped early ------------------------------------------------------------------------
@pytest.mark.parametrize("options, max_new, cause", [
    ({"kv_cache_tokens": 48}, 200, "the KV pool (48 tokens)"),
    ({"context_length": 32}, 31, "filled the context (32 tokens)"),
])
def test_a_request_cut_short_by_the_pool_or_context_says_why(server_factory, options, max_new, cause):
    server = server_factory(**options)
    with server.client() as http:
        r = http.post("/generate", json={"text": "a short prompt",
                                         "sampling_params": {"max_new_tokens": max_new, "ignore_eos": True}})
    finish = r.json()["meta_info"]["finish_reason"]
    assert finish["type"] == "length" and finish["length"] < max_new
    assert cause in finish["message"] and f"max_new_tokens={max_new}" in finish["message"]


def test_a_request_that_reaches_its_max_new_tokens_has_no_hint(server):
    with server.client() as http:
        r = http.post("/generate", json={"text": "x", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
    assert r.json()["meta_info"]["finish_reason"] == {"type": "length", "length": 3}


# ---- the OpenAPI spec ------------------------------------------------------------------------------------
def test_the_openapi_spec_lists_error_responses_and_event_streams(server):
    with server.client() as http:
        spec = http.get("/openapi.json").json()
    paths = spec["paths"]
    for path in ("/generate", "/v1/completions", "/v1/chat/completions", "/v1/programs"):
        responses = paths[path]["post"]["responses"]
        assert {"400", "413", "503"} <= set(responses), path
        assert "text/event-stream" in responses["200"]["content"] and "application/json" in responses["200"]["content"]
        assert responses["400"]["content"]["application/json"]["schema"]["$ref"].endswith("/ErrorResponse")
    assert "422" in paths["/generate"]["post"]["responses"]
    assert "503" in paths["/health"]["get"]["responses"]
    assert set(spec["components"]["schemas"]["ErrorDetail"]["properties"]) == {"message", "type", "param", "code"}


# ---- draining -----------------------------------------------------------------------------------------------
def test_a_draining_server_still_listens_answers_503_and_ends_what_runs_within_the_grace(long_tiny_model_dir,
                                                                                         stream_in_thread):
    engine = Engine(model=str(long_tiny_model_dir), kv_cache_tokens=OUTLASTS_GRACE_KV_TOKENS, device="cpu")
    try:
        with background_server(engine, grace_s=1.0) as srv:
            assert httpx.get(f"{srv.url}/health").status_code == 200
            reader, lines = stream_in_thread(srv.url, {"text": "long", "sampling_params": {
                "max_new_tokens": OUTLASTS_GRACE_TOKENS, "ignore_eos": True}})
            program: list[httpx.Response] = []
            body = {"program": story_outlasting_the_grace.trace().to_dict()}
            runner = threading.Thread(target=lambda: program.append(httpx.post(
                f"{srv.url}/v1/programs", json=body, timeout=60)))
            runner.start()
            while not srv.state.programs:  # the program runs
                time.sleep(0.01)
            began = time.monotonic()
            srv.should_exit = True  # what SIGINT / SIGTERM do
            health = generate = None
            while health is None or health.status_code != 503:
                health = httpx.get(f"{srv.url}/health")  # a new connection each time: never refused
                assert time.monotonic() - began < 5
            generate = httpx.post(f"{srv.url}/generate", json={"text": "late"})
            reader.join(30)
            runner.join(30)
            took = time.monotonic() - began
        assert health.json() == {"status": "shutting down"} and generate.status_code == 503
        assert lines[-1] == "data: [DONE]"
        assert json.loads(lines[-2][6:])["meta_info"]["finish_reason"]["type"] == "abort"
        assert program[0].status_code == 503 and "cancelled" in program[0].json()["error"]["message"]
        assert took < 1.0 + 5.0
        engine.check_invariants()
    finally:
        engine.shutdown()
