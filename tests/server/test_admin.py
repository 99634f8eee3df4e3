"""/health, /metrics, /flush_cache, /abort."""
from __future__ import annotations

import re

import pytest

LONG = {"max_new_tokens": 900, "ignore_eos": True}


def parse_metrics(text: str) -> dict[str, float]:
    values = {}
    for line in text.splitlines():
        if line.startswith("#"):
            continue
        match = re.fullmatch(r'(radixlang_|sglang:)(\w+)\{model_name="[^"]*"\} (\S+)', line)
        assert match, f"not a Prometheus sample line: {line!r}"
        prefix = "" if match.group(1) == "radixlang_" else match.group(1)  # SGLang's names keep theirs
        values[prefix + match.group(2)] = float(match.group(3))
    return values


def test_health_is_ok_while_the_engine_answers(server):
    with server.client() as http:
        r = http.get("/health")
    assert r.status_code == 200 and r.json() == {"status": "ok"}


def test_metrics_are_prometheus_text_that_agrees_with_the_engine(server):
    with server.client() as http:
        r = http.get("/metrics")
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/plain; version=0.0.4")
    for name in ("num_running_requests", "generation_tokens_total", "generation_tokens_per_second"):
        assert f"# TYPE radixlang_{name} " in r.text and f"# HELP radixlang_{name} " in r.text
    metrics, stats = parse_metrics(r.text), server.engine.stats()
    assert metrics["num_running_requests"] == metrics["num_waiting_requests"] == 0
    assert metrics["kv_pool_tokens"] == stats["kv_pool_tokens"]
    assert metrics["kv_free_tokens"] + metrics["kv_cached_tokens"] == stats["kv_pool_tokens"]
    assert metrics["generation_tokens_total"] == stats["generated_tokens_total"]
    assert metrics["kv_cache_usage"] == pytest.approx(1 - stats["kv_free_tokens"] / stats["kv_pool_tokens"])


def test_metrics_count_generated_tokens_and_report_a_rate(server):
    with server.client() as http:
        before = parse_metrics(http.get("/metrics").text)
        http.post("/generate", json={"text": "count me", "sampling_params": {"max_new_tokens": 32,
                                                                             "ignore_eos": True}})
        after = parse_metrics(http.get("/metrics").text)
    assert after["generation_tokens_total"] - before["generation_tokens_total"] == 32
    assert after["requests_finished_total"] - before["requests_finished_total"] == 1
    assert after["generation_tokens_per_second"] > 0 and after["prompt_tokens_per_second"] > 0


def test_metrics_see_a_running_request(server, stream_in_thread):
    reader, _ = stream_in_thread(server.url, {"text": "run", "sampling_params": LONG, "rid": "watched"})
    with server.client() as http:
        running = parse_metrics(http.get("/metrics").text)["num_running_requests"]
        http.post("/abort", json={"rid": "watched"})
    reader.join(30)
    assert running == 1


def test_flush_cache_empties_the_radix_cache(server):
    with server.client() as http:
        http.post("/generate", json={"text": "leave something in the cache", "sampling_params": {"max_new_tokens": 4}})
        assert server.engine.stats()["kv_cached_tokens"] > 0
        r = http.post("/flush_cache")
    assert r.status_code == 200 and r.json() == {"success": True}
    assert server.engine.stats()["kv_cached_tokens"] == 0


def test_abort_all_ends_every_request_in_flight(server, stream_in_thread):
    streams = [stream_in_thread(server.url, {"text": f"run {i}", "sampling_params": LONG}) for i in (0, 1)]
    with server.client() as http:
        assert http.post("/abort", json={"abort_all": True}).json() == {"aborted": 2}
    for reader, lines in streams:
        reader.join(30)
        assert lines[-1] == "data: [DONE]" and '"type": "abort"' in lines[-2]


@pytest.mark.parametrize("body", [{}, {"rid": "x", "abort_all": True}, {"rid": 3}])
def test_abort_rejects_a_body_without_exactly_one_target(server, body):
    with server.client() as http:
        r = http.post("/abort", json=body)
    assert r.status_code == 422 and "error" in r.json()


def test_aborting_an_unknown_rid_aborts_nothing(server):
    with server.client() as http:
        assert http.post("/abort", json={"rid": "nobody"}).json() == {"aborted": 0}


def test_unknown_routes_and_methods_get_the_json_error_body(server):
    with server.client() as http:
        missing, wrong_method = http.get("/nope"), http.get("/generate")
    assert missing.status_code == 404 and missing.json()["error"]["code"] == 404
    assert wrong_method.status_code == 405 and wrong_method.json()["error"]["message"] == "Method Not Allowed"


def test_health_fails_when_the_scheduler_does_not_answer(server, monkeypatch):
    import time

    from radixlang.server import app

    real_stats = server.engine.stats

    def stuck() -> dict:
        time.sleep(1.0)
        return real_stats()

    monkeypatch.setattr(app, "HEALTH_TIMEOUT_S", 0.2)
    monkeypatch.setattr(server.engine, "stats", stuck)
    with server.client() as http:
        r = http.get("/health")
    assert r.status_code == 503 and r.json() == {"status": "engine not responding"}
