"""POST /v1/programs and GET /get_model_info: a whole traced program in one request, compared with the
same program run in-process on the same engine."""
from __future__ import annotations

import httpx
import pytest

import radixlang as rl

SAMPLING = {"temperature": 0}


@rl.function
def fan_out(s, topic):
    s += "Facts about " + topic + ":" + rl.gen("intro", max_tokens=6)
    forks = s.fork(2)
    forks += lambda i: f"\n{i + 1}." + rl.gen("fact", max_tokens=5)
    forks.join()
    s += "\nBest:" + rl.select("best", [" one", " two"])


@rl.function
def long_story(s):  # ~2.5 s on a 2-core CPU: outlasts the 0.5 s client timeout below with room to spare
    s += "Once upon a time" + rl.gen("story", max_tokens=1000, ignore_eos=True)


def test_program_streams_events_and_matches_the_in_process_run(server, read_sse):
    body = {"program": fan_out.trace().to_dict(), "args": {"topic": "owls"}, "sampling_params": SAMPLING,
            "stream": True}
    with server.client() as http, http.stream("POST", "/v1/programs", json=body) as r:
        assert r.status_code == 200
        events = read_sse(r)
    assert events[-1] == "[DONE]"
    kinds = [e["event"] for e in events[:-1]]
    assert kinds[-1] == "end" and "text" in kinds and "var" in kinds
    end = events[-2]
    local = fan_out.run(topic="owls", backend=rl.EngineBackend(server.engine), **SAMPLING)
    assert end["text"] == local.text()
    assert {v: end["vars"][v] for v in ("intro", "fact", "best")} == {v: local[v] for v in ("intro", "fact", "best")}
    assert "".join(e["delta"] for e in events[:-2] if e["event"] == "text" and e["state"] == 0) == local.text()


def test_program_without_stream_answers_with_the_final_state(server):
    body = {"program": fan_out.trace().to_dict(), "args": {"topic": "owls"}, "sampling_params": SAMPLING}
    with server.client() as http:
        r = http.post("/v1/programs", json=body)
    assert r.status_code == 200 and r.json()["event"] == "end"
    assert r.json()["text"] == fan_out.run(topic="owls", backend=rl.EngineBackend(server.engine), **SAMPLING).text()


@pytest.mark.parametrize("body, status, match", [
    ({"program": {"version": 999}}, 400, "version"),
    ({"program": fan_out.trace().to_dict(), "args": {}}, 400, "topic"),
    ({"program": fan_out.trace().to_dict(), "args": {"topic": "x"}, "sampling_params": {"max_tokens": 3}}, 400,
     "unknown sampling default"),
    ({"program": fan_out.trace().to_dict(), "args": {"topic": "x"}, "colour": 1}, 400, "unknown field"),
])
def test_bad_programs_get_a_clear_400(server, body, status, match):
    with server.client() as http:
        r = http.post("/v1/programs", json=body)
    assert r.status_code == status and match in r.json()["error"]["message"]


def test_a_program_that_fails_while_running_reports_the_error(server):
    @rl.function
    def bad(s):
        s += "x" + rl.gen("y", top_k=10**9)

    with server.client() as http:
        r = http.post("/v1/programs", json={"program": bad.trace().to_dict()})
    assert r.status_code == 400 and "top_k" in r.json()["error"]["message"]


def test_client_disconnect_cancels_the_program_and_frees_its_kv(server):
    before = server.engine.stats()
    body = {"program": long_story.trace().to_dict(), "sampling_params": SAMPLING, "stream": True}
    with server.client() as http, http.stream("POST", "/v1/programs", json=body) as r:
        lines = r.iter_lines()
        for _ in range(6):
            next(lines)
    after = server.wait_idle()  # the KV invariant holds and nothing is left running
    assert after["aborted_requests_total"] == before["aborted_requests_total"] + 1
    assert after["generated_tokens_total"] - before["generated_tokens_total"] < 1000


def test_client_timeout_on_a_whole_program_cancels_it(server):
    before = server.engine.stats()
    with server.client(timeout=0.5) as http, pytest.raises(httpx.ReadTimeout):
        http.post("/v1/programs", json={"program": long_story.trace().to_dict()})
    after = server.wait_idle()
    assert after["aborted_requests_total"] == before["aborted_requests_total"] + 1


def test_model_info_reports_the_chat_template(server):
    with server.client() as http:
        info = http.get("/get_model_info").json()
    tok = server.engine.tokenizer
    assert info["chat_template"] == tok.chat_template and info["eos_token"] == "<|im_end|>"
    assert info["context_length"] == server.engine.context_length
    assert info["image_token"] is None  # a text model: rl.Endpoint refuses programs with images
