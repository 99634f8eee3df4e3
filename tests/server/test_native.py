"""POST /generate (SGLang's native API) against the in-process engine as the oracle."""
from __future__ import annotations

import json

import pytest

GREEDY = {"temperature": 0, "max_new_tokens": 12}
LONG = {"max_new_tokens": 900, "ignore_eos": True}  # runs for seconds unless aborted


def test_generate_returns_the_engines_greedy_completion(server):
    expected = server.engine.generate("Hello world", GREEDY)
    with server.client() as http:
        r = http.post("/generate", json={"text": "Hello world", "sampling_params": GREEDY})
    assert r.status_code == 200
    body = r.json()
    assert body["text"] == expected.text and body["output_ids"] == expected.output_ids
    meta = body["meta_info"]
    assert meta["prompt_tokens"] == len(server.engine.tokenizer.encode("Hello world"))
    assert meta["completion_tokens"] == len(expected.output_ids) == 12
    assert meta["finish_reason"] == {"type": "length", "length": 12}
    assert meta["id"] and meta["e2e_latency"] > 0


def test_batch_with_n_returns_every_sample_prompt_major_with_expanded_rids(server):
    prompts = [server.engine.tokenizer.encode(t) for t in ("one two", "three four five")]
    params = {"temperature": 0.9, "n": 2, "seed": 7, "max_new_tokens": 6}
    expected = server.engine.generate(input_ids=prompts, sampling_params=params)
    with server.client() as http:
        r = http.post("/generate", json={"input_ids": prompts, "sampling_params": params, "rid": ["a", "b"]})
    assert r.status_code == 200
    items = r.json()
    assert [i["text"] for i in items] == [e.text for e in expected]
    assert [i["meta_info"]["id"] for i in items] == ["a-0", "a-1", "b-0", "b-1"]
    assert [i["meta_info"]["prompt_tokens"] for i in items] == [len(prompts[0])] * 2 + [len(prompts[1])] * 2


def test_single_input_ids_prompt_matches_the_same_text_prompt(server):
    ids = server.engine.tokenizer.encode("Hello world")
    with server.client() as http:
        by_ids = http.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY}).json()
        by_text = http.post("/generate", json={"text": "Hello world", "sampling_params": GREEDY}).json()
    assert by_ids["output_ids"] == by_text["output_ids"]


def test_logprobs_follow_sglangs_layout_and_match_the_engine(server):
    tok = server.engine.tokenizer
    prompt = "The cat sat on the mat"
    ids = tok.encode(prompt)
    expected = server.engine.generate(prompt, GREEDY, return_logprob=True, logprob_start_len=0, top_logprobs_num=3)
    with server.client() as http:
        meta = http.post("/generate", json={
            "text": prompt, "sampling_params": GREEDY, "return_logprob": True, "logprob_start_len": 0,
            "top_logprobs_num": 3, "return_text_in_logprobs": True}).json()["meta_info"]
    inputs = meta["input_token_logprobs"]
    assert inputs[0] == [None, ids[0], tok.decode([ids[0]])]  # nothing scores the first token
    assert [e[1] for e in inputs] == ids
    assert [e[0] for e in inputs[1:]] == pytest.approx([lp.logprob for lp in expected.meta.input_logprobs])
    assert meta["input_top_logprobs"][0] is None and all(len(t) == 3 for t in meta["input_top_logprobs"][1:])
    outputs = meta["output_token_logprobs"]
    assert [e[1] for e in outputs] == expected.output_ids
    assert [e[2] for e in outputs] == [tok.decode([t]) for t in expected.output_ids]
    for (lp, token, _), top in zip(outputs, meta["output_top_logprobs"]):
        assert [t[0] for t in top] == sorted((t[0] for t in top), reverse=True)
        assert top[0][1] == token and top[0][0] == pytest.approx(lp)  # greedy picks the top token


def test_logprob_start_len_scores_the_prompt_from_that_position(server):
    ids = server.engine.tokenizer.encode("alpha beta gamma delta epsilon")
    with server.client() as http:
        meta = http.post("/generate", json={"input_ids": ids, "sampling_params": GREEDY, "return_logprob": True,
                                            "logprob_start_len": 2}).json()["meta_info"]
    assert [e[1] for e in meta["input_token_logprobs"]] == ids[2:]
    assert all(e[2] is None for e in meta["input_token_logprobs"])  # no text unless asked for


def test_stream_events_grow_to_the_non_streaming_result(server, read_sse):
    expected = server.engine.generate("Once upon a time", GREEDY)
    with server.client() as http, http.stream(
            "POST", "/generate", json={"text": "Once upon a time", "sampling_params": GREEDY, "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = read_sse(r)
    assert events[-1] == "[DONE]"
    events = events[:-1]
    for before, after in zip(events, events[1:]):
        assert after["text"].startswith(before["text"])
        assert after["output_ids"][: len(before["output_ids"])] == before["output_ids"]
    assert all(e["meta_info"]["finish_reason"] is None for e in events[:-1])
    assert events[-1]["meta_info"]["finish_reason"] == {"type": "length", "length": 12}
    assert events[-1]["text"] == expected.text and events[-1]["output_ids"] == expected.output_ids


def test_stream_of_a_batch_tags_each_event_with_its_index(server, read_sse):
    texts = ["red green", "blue yellow orange"]
    expected = server.engine.generate(texts, GREEDY)
    with server.client() as http, http.stream(
            "POST", "/generate", json={"text": texts, "sampling_params": GREEDY, "stream": True}) as r:
        events = read_sse(r)[:-1]
    finals = {e["index"]: e for e in events if e["meta_info"]["finish_reason"] is not None}
    assert sorted(finals) == [0, 1]
    assert [finals[i]["text"] for i in (0, 1)] == [e.text for e in expected]


def test_stop_string_ends_generation_before_it(server):
    full = server.engine.generate("Hello world", {"temperature": 0, "max_new_tokens": 16}).text
    stop = full[6:9]
    params = {"temperature": 0, "max_new_tokens": 16, "stop": [stop]}
    with server.client() as http:
        body = http.post("/generate", json={"text": "Hello world", "sampling_params": params}).json()
    assert body["text"] == full[: full.index(stop)]
    assert body["meta_info"]["finish_reason"] == {"type": "stop", "matched": stop}


def test_prefill_only_request_caches_the_prompt_for_the_next(server):
    ids = server.engine.tokenizer.encode("a prompt that will be cached for the next request to reuse")
    with server.client() as http:
        first = http.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 0}}).json()
        second = http.post("/generate", json={"input_ids": ids, "sampling_params": {"max_new_tokens": 1}}).json()
    assert first["text"] == "" and first["meta_info"]["finish_reason"]["type"] == "length"
    assert second["meta_info"]["cached_tokens"] == len(ids) - 1  # the last token is recomputed for its logits


@pytest.mark.parametrize("body, status, param, words", [
    ({"text": "x", "tempreature": 0}, 422, "tempreature", "unknown field"),
    ({"text": "x", "input_ids": [1, 2]}, 422, None, "exactly one of text and input_ids"),
    ({}, 422, None, "exactly one of text and input_ids"),
    ({"text": 5}, 422, "text", "string"),
    ({"text": "x", "stream": "yes"}, 422, "stream", "boolean"),
    ({"text": "x", "sampling_params": {"temprature": 0}}, 400, None, "temprature"),
    ({"text": "x", "sampling_params": {"max_new_tokens": -1}}, 400, "sampling_params.max_new_tokens", "[0,"),
    ({"text": "x", "sampling_params": {"top_p": 0}}, 400, "sampling_params.top_p", "(0, 1]"),
    ({"text": "x", "sampling_params": {"n": 10**9}}, 400, "sampling_params.n", "[1, 128]"),
    ({"text": "x", "sampling_params": {"max_new_tokens": 2, "min_new_tokens": 3}}, 400,
     "sampling_params.min_new_tokens", "sampling_params.min_new_tokens must be in [0, 2], got 3"),
    ({"text": "x", "return_logprob": True, "top_logprobs_num": -2}, 400, "top_logprobs_num", "[0,"),
    ({"text": ["a", "b"], "rid": "r"}, 400, "rid", "one non-empty string per prompt"),
    ({"text": ["a", "b"], "rid": ["r", "r"]}, 400, "rid", "unique"),
    ({"text": ["a", "b"], "rid": ["r", "r-0"], "sampling_params": {"n": 2}}, 400, "rid", "unique"),
    ({"text": ""}, 400, None, "prompt is empty"),
    ({"input_ids": [10**9]}, 400, "input_ids", "token ids in"),
    ({"input_ids": [1] * 2000}, 400, None, "context holds"),
])
def test_bad_requests_get_a_json_error_naming_the_problem(server, body, status, param, words):
    with server.client() as http:
        r = http.post("/generate", json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert error["code"] == status and words in error["message"]
    if param is not None:
        assert error["param"] == param


def test_tokenize_and_detokenize_follow_the_engines_tokenizer(server):
    """vLLM's /tokenize and /detokenize, against the tokenizer the engine encodes /generate's text with."""
    tok, text = server.engine.tokenizer, "Hello <|im_start|> wörld"
    with server.client() as http:
        ids = http.post("/tokenize", json={"prompt": text}).json()
        bare = http.post("/tokenize", json={"prompt": text, "add_special_tokens": False}).json()
        back = http.post("/detokenize", json={"tokens": ids["tokens"]})
        bad_id = http.post("/detokenize", json={"tokens": [1, tok.vocab_size]})
        unknown = http.post("/tokenize", json={"prompt": "x", "text": "y"})
    assert ids == {"tokens": tok.encode(text), "count": len(tok.encode(text)),
                   "max_model_len": server.engine.context_length}
    assert bare["tokens"] == tok.encode(text, add_special_tokens=False)
    assert back.status_code == 200 and back.json()["prompt"] == tok.decode(ids["tokens"], skip_special_tokens=False)
    assert bad_id.status_code == 400 and bad_id.json()["error"]["param"] == "tokens[1]"
    assert unknown.status_code == 422 and "text" in unknown.text


def test_a_body_that_is_not_a_json_object_is_a_422_saying_so(server):
    with server.client() as http:
        malformed = http.post("/generate", content=b"{not json", headers={"content-type": "application/json"})
        form = http.post("/generate", content=b'{"text": "x"}',
                         headers={"content-type": "application/x-www-form-urlencoded"})  # curl -d
    assert malformed.status_code == 422 and "JSON" in malformed.json()["error"]["message"]
    assert form.status_code == 422 and "Content-Type: application/json" in form.json()["error"]["message"]


def test_a_bad_streaming_request_is_an_error_status_not_an_event_stream(server):
    with server.client() as http:
        r = http.post("/generate", json={"text": "x", "stream": True, "sampling_params": {"n": 0}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "sampling_params.n"


def _final_event(lines: list[str]) -> dict:
    assert lines[-1] == "data: [DONE]"
    return json.loads(lines[-2][len("data: "):])


def test_abort_by_rid_ends_the_stream_with_finish_reason_abort(server, stream_in_thread):
    reader, lines = stream_in_thread(server.url, {"text": "go", "sampling_params": LONG, "rid": "to-abort"})
    with server.client() as http:
        assert http.post("/abort", json={"rid": "to-abort"}).json() == {"aborted": 1}
    reader.join(30)
    final = _final_event(lines)
    assert final["meta_info"]["finish_reason"] == {"type": "abort", "message": "request aborted"}
    assert final["meta_info"]["completion_tokens"] < LONG["max_new_tokens"]


def test_a_rid_in_flight_cannot_be_reused(server, stream_in_thread):
    reader, lines = stream_in_thread(server.url, {"text": "go", "sampling_params": LONG, "rid": "busy"})
    with server.client() as http:
        r = http.post("/generate", json={"text": "x", "rid": "busy"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "rid"
        http.post("/abort", json={"rid": "busy"})
    reader.join(30)
    assert _final_event(lines)["meta_info"]["finish_reason"]["type"] == "abort"


def test_client_disconnect_mid_stream_aborts_the_request_and_frees_its_kv(server):
    before = server.engine.stats()
    with server.client() as http, http.stream(
            "POST", "/generate", json={"text": "go", "sampling_params": LONG, "stream": True}) as r:
        lines = r.iter_lines()
        for _ in range(4):
            next(lines)
    after = server.wait_idle()  # checks the KV invariant too
    assert after["aborted_requests_total"] == before["aborted_requests_total"] + 1
    assert after["generated_tokens_total"] - before["generated_tokens_total"] < LONG["max_new_tokens"]


def test_client_disconnect_before_a_non_streaming_response_aborts_it(server):
    import httpx

    before = server.engine.stats()
    with server.client(timeout=0.3) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/generate", json={"text": "go", "sampling_params": LONG})
    after = server.wait_idle()
    assert after["aborted_requests_total"] == before["aborted_requests_total"] + 1
    assert after["generated_tokens_total"] - before["generated_tokens_total"] < LONG["max_new_tokens"]


def _fail_forward_calls(monkeypatch, runner, from_call: int) -> None:
    real, calls = runner.forward, [0]

    def forward(chunks):
        calls[0] += 1
        if calls[0] >= from_call:
            monkeypatch.setattr(runner, "forward", real)  # fail once, then recover
            raise RuntimeError("injected failure")
        return real(chunks)

    monkeypatch.setattr(runner, "forward", forward)


def test_a_request_that_fails_inside_the_engine_gets_a_500_and_the_engine_keeps_serving(server, monkeypatch):
    expected = server.engine.generate("Hello world", GREEDY)
    _fail_forward_calls(monkeypatch, server.engine.runner, from_call=1)
    with server.client() as http:
        r = http.post("/generate", json={"text": "Hello world", "sampling_params": GREEDY})
        assert r.status_code == 500 and "injected failure" in r.json()["error"]["message"]
        server.wait_idle()
        again = http.post("/generate", json={"text": "Hello world", "sampling_params": GREEDY})
    assert again.status_code == 200 and again.json()["text"] == expected.text


def test_a_stream_that_fails_inside_the_engine_ends_with_an_error_event(server, monkeypatch, read_sse):
    _fail_forward_calls(monkeypatch, server.engine.runner, from_call=4)
    with server.client() as http, http.stream(
            "POST", "/generate", json={"text": "go", "sampling_params": GREEDY, "stream": True}) as r:
        events = read_sse(r)
    assert events[-1] == "[DONE]"
    assert "injected failure" in events[-2]["error"]["message"] and events[-2]["error"]["code"] == 500
    assert len(events) >= 4  # the tokens before the failure still arrived


def test_a_bug_while_rendering_a_stream_still_ends_it_with_an_error_event(server, monkeypatch, read_sse):
    from radixlang.server import native

    def broken(*args, **kwargs):
        raise KeyError("render bug")

    monkeypatch.setattr(native, "meta_info", broken)
    with server.client() as http, http.stream("POST", "/generate", json={
            "text": "go", "sampling_params": LONG, "stream": True, "return_logprob": True}) as r:
        events = read_sse(r)
    assert events[-1] == "[DONE]" and "render bug" in events[-2]["error"]["message"]
    assert len(events) == 2  # nothing else went out; the request was aborted (the fixture checks the KV)
