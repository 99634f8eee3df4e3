"""Sessions over HTTP in OpenAI's own field: prompt_cache_key on /v1/chat/completions and /v1/completions
(through the openai SDK), session / prompt_cache_key on /generate, the release endpoint, and a keyed
request's pin dropped when its client disconnects."""
from __future__ import annotations

import time

import pytest

openai = pytest.importorskip("openai", reason="the openai SDK is the peer client")

POOL = 1024
GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}


def words(seed: int, n: int) -> str:
    return " ".join(f"w{seed}x{i}" for i in range(n // 3))


@pytest.fixture(scope="module")
def session_server(tiny_model_dir):
    from tests.server.conftest import serving

    with serving(tiny_model_dir, kv_cache_tokens=POOL) as live:
        yield live


def flood(http) -> None:
    """Unique one-shot prompts, together twice the pool: every unpinned prefix goes."""
    r = http.post("/generate", json={"text": [words(100 + i, 120) for i in range(8)], "sampling_params": GREEDY})
    assert r.status_code == 200


def test_chat_prompt_cache_key_keeps_the_conversation_through_pressure(session_server):
    client = openai.OpenAI(base_url=session_server.url + "/v1", api_key="none")
    history = [{"role": "user", "content": words(1, 200)}]
    first = client.chat.completions.create(model="default", messages=history, max_tokens=4, temperature=0,
                                           prompt_cache_key="agent-7")
    with session_server.client() as http:
        flood(http)
    history += [{"role": "assistant", "content": first.choices[0].message.content},
                {"role": "user", "content": "go on"}]
    second = client.chat.completions.create(model="default", messages=history, max_tokens=4, temperature=0,
                                            prompt_cache_key="agent-7")
    cached = second.usage.prompt_tokens_details.cached_tokens
    assert cached >= first.usage.prompt_tokens - 1  # the first turn's prompt, at least, was kept
    with session_server.client() as http:
        r = http.post("/v1/prompt_cache/release", json={"prompt_cache_key": "agent-7"})
        assert r.json()["released"] and r.json()["tokens"] > cached
        assert not http.post("/v1/prompt_cache/release", json={"prompt_cache_key": "agent-7"}).json()["released"]
    stats = session_server.wait_idle()
    assert stats["kv_pins"] == 0


def test_generate_session_and_completions_prompt_cache_key(session_server):
    client = openai.OpenAI(base_url=session_server.url + "/v1", api_key="none")
    with session_server.client() as http:
        r = http.post("/generate", json={"text": words(2, 150), "sampling_params": GREEDY, "session": "s2"})
        prompt_tokens = r.json()["meta_info"]["prompt_tokens"]
        flood(http)
        again = http.post("/generate", json={"text": words(2, 150) + " on", "sampling_params": GREEDY,
                                             "prompt_cache_key": "s2"})
        assert again.json()["meta_info"]["cached_tokens"] >= prompt_tokens - 1
        comp = client.completions.create(model="default", prompt=words(3, 150), max_tokens=2, temperature=0,
                                         extra_body={"prompt_cache_key": "s3"})  # the SDK's legacy route lacks it
        flood(http)
        comp2 = client.completions.create(model="default", prompt=words(3, 150), max_tokens=2, temperature=0,
                                          extra_body={"prompt_cache_key": "s3"})  # the SDK's legacy route lacks it
        assert comp2.usage.prompt_tokens_details.cached_tokens == comp.usage.prompt_tokens - 1  # all but the last
        metrics = http.get("/metrics").text
        assert "radixlang_kv_pinned_tokens" in metrics and "radixlang_recomputed_cached_tokens_total" in metrics
        # the two sessions' ~700 tokens exceed the pinned budget (half the pool): the older one gave way
        assert not http.post("/v1/prompt_cache/release", json={"prompt_cache_key": "s2"}).json()["released"]
        assert http.post("/v1/prompt_cache/release", json={"prompt_cache_key": "s3"}).json()["released"]
        assert session_server.engine.stats()["pins_released_under_pressure_total"] >= 1
    session_server.wait_idle()


def test_client_disconnect_releases_the_session(session_server):
    with session_server.client() as http:
        http.post("/generate", json={"text": words(4, 90), "sampling_params": GREEDY, "session": "s4"})
        assert session_server.engine.stats()["kv_pins"] == 1
        long = {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}
        with http.stream("POST", "/generate", json={"text": words(4, 90) + " more", "sampling_params": long,
                                                    "stream": True, "session": "s4"}) as r:
            lines = r.iter_lines()
            for _ in range(3):
                next(lines)
    stats = session_server.wait_idle()
    assert stats["kv_pins"] == 0 and stats["kv_pinned_tokens"] == 0


def test_bad_session_fields_are_refused_naming_them(session_server):
    with session_server.client() as http:
        r = http.post("/generate", json={"text": "hi", "session": "a", "prompt_cache_key": "b"})
        assert r.status_code in (400, 422) and "session" in r.text
        r = http.post("/v1/completions", json={"model": "default", "prompt": "hi", "prompt_cache_key": ""})
        assert r.status_code in (400, 422) and "prompt_cache_key" in r.text
        r = http.post("/v1/prompt_cache/release", json={})
        assert r.status_code in (400, 422) and "prompt_cache_key" in r.text
    session_server.wait_idle()


def test_a_server_side_program_pins_while_it_runs_and_nothing_once_disconnected(session_server, monkeypatch):
    import json

    import radixlang as rl

    @rl.function
    def two_steps(s):
        s += words(5, 90) + rl.gen("first", max_tokens=3, temperature=0, ignore_eos=True)
        s += " then" + rl.gen("second", max_tokens=600, temperature=0, ignore_eos=True)

    # read as "second" is submitted: a later read races its decode, whose 600 tokens may end the run (or
    # pressure the 1,024-slot pool) before a slow client gets there
    engine, pins_at_second = session_server.engine, []
    real_stream = engine.stream

    def stream(prompt=None, *args, **kwargs):
        if prompt and prompt.endswith(" then"):
            pins_at_second.append(engine.stats()["kv_pins"])
        return real_stream(prompt, *args, **kwargs)

    monkeypatch.setattr(engine, "stream", stream)
    body = {"program": two_steps.trace().to_dict(), "stream": True}
    with session_server.client() as http:  # no earlier test's pins: this run's are the only ones
        assert http.post("/flush_cache").status_code == 200
    with session_server.client() as http, http.stream("POST", "/v1/programs", json=body) as r:
        for line in r.iter_lines():
            event = json.loads(line.removeprefix("data: ")) if line.startswith("data: {") else {}
            if event.get("event") == "var" and event.get("name") == "first":
                break
        deadline = time.monotonic() + 10  # the program's thread submits "second" after the event
        while not pins_at_second and time.monotonic() < deadline:
            time.sleep(0.01)
    assert pins_at_second == [1]  # the state's sequence, pinned after "first", while "second" starts
    session_server.wait_idle()  # the client left: the run was cancelled
    deadline = time.monotonic() + 10  # its program thread releases the pins as the run ends
    while session_server.engine.stats()["kv_pins"] and time.monotonic() < deadline:
        time.sleep(0.01)
    assert session_server.engine.stats()["kv_pins"] == 0 and session_server.engine.stats()["kv_pinned_tokens"] == 0


def test_sglang_priority_field_reaches_the_scheduler_on_every_route(session_server, monkeypatch):
    seen = []
    real = session_server.engine.validator.build
    monkeypatch.setattr(session_server.engine.validator, "build",
                        lambda *a, **k: seen.append(k["priority"]) or real(*a, **k))
    with session_server.client() as http:
        bodies = [("/generate", {"text": "hi", "sampling_params": GREEDY, "priority": 5}),
                  ("/v1/completions", {"model": "default", "prompt": "hi", "max_tokens": 2, "priority": -2}),
                  ("/v1/chat/completions", {"model": "default", "messages": [{"role": "user", "content": "hi"}],
                                            "max_tokens": 2, "priority": 1}),
                  ("/generate", {"text": "hi", "sampling_params": GREEDY})]
        for route, body in bodies:
            assert http.post(route, json=body).status_code == 200
        assert http.post("/generate", json={"text": "hi", "priority": "high"}).status_code in (400, 422)
    assert seen == [5, -2, 1, 0]
