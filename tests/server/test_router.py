"""radixlang as a worker of SGLang's router (the real `sglang-router` wheel): the routes and request fields
the router needs, and `radixlang serve --dp 2` as a fleet behind it."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Iterator

import httpx
import openai
import psutil
import pytest

import radixlang as rl
from radixlang.server.fleet import healthy_workers

from .test_admin import parse_metrics

# SGLang's router adds these to every /generate it forwards (smg's GenerateRequest: they have defaults)
ROUTER_GENERATE_FIELDS = {"model": "unknown", "log_metrics": True, "return_hidden_states": False,
                          "background": False, "no_logs": False, "return_bytes": False, "return_entropy": False}
ROUTER_CHAT_FIELDS = {"continue_final_message": False, "separate_reasoning": True, "stream_reasoning": True,
                      "no_stop_trim": False, "return_hidden_states": False}


# ---- the worker contract, in process ---------------------------------------------------------------
def test_generate_accepts_the_fields_the_router_adds(server):
    with server.client() as c:
        r = c.post("/generate", json={"text": "Hello", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True},
                                      **ROUTER_GENERATE_FIELDS, "priority": 1, "data_parallel_rank": 0})
        assert r.status_code == 200, r.text
        assert r.json()["meta_info"]["completion_tokens"] == 3


@pytest.mark.parametrize("field,value", [("return_hidden_states", True), ("lora_id", "adapter"),
                                         ("data_parallel_rank", 1), ("bootstrap_room", 7)])
def test_generate_refuses_an_sglang_feature_it_lacks_naming_the_field(server, field, value):
    with server.client() as c:
        r = c.post("/generate", json={"text": "Hello", field: value})
    assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


def test_a_field_neither_sglang_nor_openai_defines_stays_refused(server):
    with server.client() as c:
        assert c.post("/generate", json={"text": "Hello", "program": {}}).status_code == 422
        r = c.post("/v1/chat/completions", json={"model": "default", "messages": [{"role": "user", "content": "Hi"}],
                                                 "no_such_field": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "no_such_field"


def test_chat_accepts_the_fields_the_router_adds_and_refuses_continue_final_message(server):
    messages = [{"role": "user", "content": "Hi"}]
    with openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0) as client:
        out = client.chat.completions.create(model="default", messages=messages, max_tokens=2,
                                             extra_body={**ROUTER_CHAT_FIELDS, "ignore_eos": True})
        assert out.usage.completion_tokens == 2
        with pytest.raises(openai.BadRequestError, match="continue_final_message"):
            client.chat.completions.create(model="default", messages=messages, max_tokens=2,
                                           extra_body={"continue_final_message": True})


def test_info_load_and_deep_health_routes(server):
    with server.client() as c:
        info = c.get("/server_info").json()
        assert info == c.get("/get_server_info").json() | {"internal_states": info["internal_states"]}
        assert info["max_total_num_tokens"] == server.engine.pool_size and info["dp_size"] == 1
        assert (info["decode_compile"] == "off") == (server.engine.decode_compile is None)
        assert c.get("/model_info").json() == c.get("/get_model_info").json()
        assert c.get("/health_generate").json() == {"status": "ok"}
        loads = c.get("/v1/loads").json()
        assert loads["dp_rank_count"] == 1
        (load,) = loads["loads"]
        assert load["max_total_num_tokens"] == server.engine.pool_size and load["num_total_reqs"] == 0
        assert c.get("/get_load").json()["load"] == 0
        # the gauges a router's load monitor reads from /metrics when a worker has no /v1/loads
        metrics = parse_metrics(c.get("/metrics").text)
        assert metrics["sglang:token_usage"] == pytest.approx(load["token_usage"])
        assert metrics["sglang:num_running_reqs"] == metrics["sglang:num_queue_reqs"] == 0


def test_dp_without_the_router_wheel_says_how_to_install_it(monkeypatch, capsys):
    from radixlang.server import cli, fleet

    monkeypatch.setattr(fleet, "router_available", lambda: False)
    assert cli.main(["serve", "--dp", "2", "--model", "/no/such/model"]) == 2
    assert "pip install sglang-router" in capsys.readouterr().err


# ---- a fleet behind the real router -----------------------------------------------------------------
class Fleet:
    def __init__(self, proc: subprocess.Popen, url: str, workers: list[str]):
        self.proc, self.url, self.workers = proc, url, workers


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fleet(tiny_model_dir) -> Iterator[Fleet]:
    pytest.importorskip("sglang_router", reason="the sglang-router wheel does not install on this platform")
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixlang", "serve", "--dp", "2", "--model", str(tiny_model_dir), "--port", str(port),
         "--device", "cpu", "--kv-cache-tokens", "4096", "--served-model-name", "tiny", "--graceful-timeout", "10",
         "--compile-layers", "false",
         "--log-level", "warning"],
        stdout=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
    line = proc.stdout.readline()  # printed once the router lists both workers healthy
    assert line.startswith("radixlang: router at"), f"the fleet did not start: {line!r} (exit {proc.poll()})"
    workers = line.split(" in front of ")[1].strip().split(", ")
    yield Fleet(proc, f"http://127.0.0.1:{port}", workers)
    if proc.poll() is None:  # a test failed before SIGTERM: stop the fleet as a user would
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(60)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _metric(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics", timeout=10).text
    (line,) = [ln for ln in text.splitlines() if ln.startswith(f"radixlang_{name}{{")]
    return float(line.rsplit(" ", 1)[1])


def test_the_fleet_serves_the_openai_sdk_and_generate_through_the_router(fleet):
    assert len(fleet.workers) == 2 and healthy_workers(fleet.url) == 2
    # the router listens on our host only: its public port and its Prometheus endpoint on a free port
    # (its own default would be 0.0.0.0:29000)
    (router,) = [p for p in psutil.Process(fleet.proc.pid).children() if "sglang" in " ".join(p.cmdline())]
    listening = {c.laddr for c in router.net_connections("inet") if c.status == psutil.CONN_LISTEN}
    port = int(fleet.url.rsplit(":", 1)[1])
    assert {ip for ip, _ in listening} == {"127.0.0.1"} and len(listening) == 2, listening
    assert port in {p for _, p in listening} and 29000 not in {p for _, p in listening}
    with openai.OpenAI(base_url=f"{fleet.url}/v1", api_key="unused", max_retries=0) as client:
        chat = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                              max_tokens=4, extra_body={"ignore_eos": True})
        assert chat.usage.completion_tokens == 4
        completion = client.completions.create(model="tiny", prompt="Once upon", max_tokens=3,
                                               extra_body={"ignore_eos": True})
        assert completion.usage.completion_tokens == 3
    r = httpx.post(f"{fleet.url}/generate", json={"text": "Once upon a time", "sampling_params": {
        "max_new_tokens": 5, "ignore_eos": True, "temperature": 0}}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 5


def test_the_same_prefix_lands_on_the_worker_that_caches_it(fleet):
    httpx.post(f"{fleet.url}/flush_cache", timeout=30)
    prefix = "You are a careful assistant. Answer every question about the solar system briefly. " * 4
    cached = []
    for i in range(6):
        r = httpx.post(f"{fleet.url}/generate", json={"text": f"{prefix}Question {i}: which planet?",
                                                      "sampling_params": {"max_new_tokens": 1}}, timeout=60)
        assert r.status_code == 200, r.text
        cached.append(r.json()["meta_info"]["cached_tokens"])
    prompt_tokens = [_metric(w, "prompt_tokens_total") for w in fleet.workers]
    # after the first request, every one found the prefix cached: the router sent it where the prefix is
    assert cached[0] == 0 and min(cached[1:]) >= 60, cached
    assert min(prompt_tokens) < max(prompt_tokens)  # one worker took them


def test_flush_cache_through_the_router_reaches_every_worker(fleet):
    for worker in fleet.workers:  # a cached prefix on each
        httpx.post(f"{worker}/generate", json={"text": "Some text to cache " * 8,
                                              "sampling_params": {"max_new_tokens": 1}}, timeout=60)
        assert _metric(worker, "kv_cached_tokens") > 0
    assert httpx.post(f"{fleet.url}/flush_cache", timeout=30).status_code == 200
    assert [_metric(w, "kv_cached_tokens") for w in fleet.workers] == [0.0, 0.0]


def test_a_second_router_with_another_policy_fronts_the_same_workers(fleet):
    """Fleet.add_router (benchmark/scale_out.py compares policies on the same worker processes with it)."""
    from radixlang.server.fleet import Fleet as Processes
    from radixlang.server.fleet import FleetSpec

    spec = FleetSpec(host="127.0.0.1", port=_free_port(), dp=2, worker_args=[], grace_s=2, log_level="warning")
    more = Processes(spec)
    more.worker_urls = list(fleet.workers)  # the fixture's workers, started by `serve --dp 2`
    try:
        url = more.add_router("round_robin")
        before = [_metric(w, "prompt_tokens_total") for w in fleet.workers]
        for _ in range(4):  # the same prompt: cache_aware would send all four to one worker
            r = httpx.post(f"{url}/generate", json={"text": "Round and round the garden",
                                                    "sampling_params": {"max_new_tokens": 1}}, timeout=60)
            assert r.status_code == 200, r.text
        added = [_metric(w, "prompt_tokens_total") - b for w, b in zip(fleet.workers, before)]
        assert added[0] == added[1] > 0, added  # two each
    finally:
        more.stop()
    assert more.more_routers[0].poll() is not None and healthy_workers(fleet.url) == 2  # the workers serve on


@rl.function
def pick(s, topic):
    s += "Topic: " + topic + ". One word about it:" + rl.gen("word", max_tokens=4)
    s += "\nIs it good? " + rl.select("verdict", ["yes", "no", "maybe"])


def test_programs_run_per_primitive_through_the_router_as_on_one_worker(fleet):
    via_router, direct = rl.Endpoint(fleet.url), rl.Endpoint(fleet.workers[0])
    assert via_router.behind_router() and not direct.behind_router()
    for topic in ("rivers", "owls"):  # select's scoring prompts go one per request through the router
        routed = pick.run(topic=topic, backend=via_router, temperature=0)
        alone = pick.run(topic=topic, backend=direct, temperature=0)
        assert (routed["word"], routed["verdict"]) == (alone["word"], alone["verdict"])
    state = pick.run(topic="x", backend=via_router, remote=True)
    assert isinstance(state.error(), ValueError) and "remote=False" in str(state.error())


def test_a_worker_killed_mid_request_fails_it_clearly_the_fleet_serves_on_and_it_rejoins(fleet):
    long = {"text": "Count to a thousand:", "sampling_params": {"max_new_tokens": 900, "ignore_eos": True}}
    with ThreadPoolExecutor(1) as pool:
        in_flight = pool.submit(httpx.post, f"{fleet.url}/generate", json=long, timeout=120)
        victim = _running_on(fleet.workers)  # the worker the router sent it to
        pid = httpx.get(f"{victim}/server_info", timeout=10).json()["pid"]
        os.kill(pid, signal.SIGKILL)
        r = in_flight.result(timeout=60)  # it does not hang: it fails at once, with an error that says why
    assert r.status_code >= 500 and "upstream" in r.text, (r.status_code, r.text)
    started, served_in_a_row, i = time.monotonic(), 0, 0
    while served_in_a_row < 6:  # until the router's health check drops the dead worker (or it is back)
        r = httpx.post(f"{fleet.url}/generate", json={"text": f"still here {i}",
                                                      "sampling_params": {"max_new_tokens": 2}}, timeout=60)
        # a request routed to the dead worker before then fails at once, with an error that says so
        assert r.status_code == 200 or (r.status_code >= 500 and "upstream" in r.text), r.text
        served_in_a_row = served_in_a_row + 1 if r.status_code == 200 else 0
        i += 1
        assert time.monotonic() - started < 90, "the fleet did not serve again after a worker died"
    # the fleet starts it again on its port, and the router's health check takes it back
    deadline = time.monotonic() + 180
    while _pid(victim) in (None, pid) or healthy_workers(fleet.url) < 2:
        assert time.monotonic() < deadline, "the killed worker did not rejoin"
        time.sleep(0.5)


def test_sigterm_finishes_the_request_in_flight_then_stops_it_all(fleet):
    # streamed, so that its first event proves it is running on a worker when the signal goes: the tiny model
    # makes a few hundred tokens a second, and polling /v1/loads could miss a request that short altogether
    request = {"text": "Once upon a time", "stream": True,
               "sampling_params": {"max_new_tokens": 300, "ignore_eos": True}}
    with httpx.stream("POST", f"{fleet.url}/generate", json=request, timeout=120) as response:
        assert response.status_code == 200, response.read()
        events = (line.removeprefix("data: ") for line in response.iter_lines() if line.startswith("data: "))
        first = json.loads(next(events))
        assert first["meta_info"]["completion_tokens"] < 300, "the request ended before the signal could be sent"
        fleet.proc.send_signal(signal.SIGTERM)
        last = json.loads([event for event in events if event != "[DONE]"][-1])
    assert last["meta_info"]["completion_tokens"] == 300, last  # drained, not cut
    assert fleet.proc.wait(60) == 0
    for base in [fleet.url, *fleet.workers]:
        with pytest.raises(httpx.TransportError):
            httpx.get(f"{base}/health", timeout=2)


def _running_on(workers: list[str]) -> str:
    """The worker running a request now (polled from its /v1/loads until one is)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for worker in workers:
            if httpx.get(f"{worker}/v1/loads", timeout=10).json()["loads"][0]["num_running_reqs"]:
                return worker
        time.sleep(0.05)
    raise AssertionError("no worker ran the request")


def _pid(base: str) -> int | None:
    try:
        return httpx.get(f"{base}/server_info", timeout=5).json()["pid"]
    except httpx.TransportError:
        return None
