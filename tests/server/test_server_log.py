"""What the server says: the banner's facts against the model's own config, step lines computed from counter
deltas by hand, --log-requests bodies (truncated), and the shutdown line."""
from __future__ import annotations

import logging

import httpx
import pytest

from radixlang.runtime.engine import Engine
from radixlang.server.launch import background_server
from radixlang.server.server_log import StepLog, step_line
from radixlang.testing.random_llama import TINY_CONFIG


def _stats(**values: float) -> dict[str, float]:
    base = {"prompt_tokens_total": 0, "cached_tokens_total": 0, "generated_tokens_total": 0, "running_requests": 0,
            "waiting_requests": 0, "kv_usage": 0.0, "kv_pool_tokens": 4096, "finished_requests_total": 0,
            "aborted_requests_total": 0}
    return base | values


def test_a_step_line_reports_the_intervals_rates_and_hit_rate():
    before = _stats(prompt_tokens_total=100, cached_tokens_total=20, generated_tokens_total=50)
    after = _stats(prompt_tokens_total=300, cached_tokens_total=170, generated_tokens_total=250,
                   running_requests=3, waiting_requests=1, kv_usage=0.25)
    # 200 prompt tokens, 150 of them cached: 75% hits, 50 computed in 2 s; 200 generated in 2 s
    assert step_line(before, after, 2.0) == ("step: running 3, queued 1, KV 25.0% of 4096 tokens, cache hit 75.0%, "
                                             "prefill 25.0 tok/s, decode 100.0 tok/s")


def test_step_lines_come_every_interval_while_busy_and_never_while_idle(caplog):
    caplog.set_level(logging.INFO, logger="radixlang.server")
    log = StepLog(interval_s=5.0)
    log.observe(0.0, _stats())
    log.observe(4.0, _stats(generated_tokens_total=40, running_requests=1))  # inside the interval
    assert not caplog.records
    log.observe(5.0, _stats(generated_tokens_total=50, running_requests=1))
    assert [r.getMessage() for r in caplog.records] == [
        "step: running 1, queued 0, KV 0.0% of 4096 tokens, cache hit -, prefill 0.0 tok/s, decode 10.0 tok/s"]
    log.observe(10.0, _stats(generated_tokens_total=60))  # finished during this interval: still reported
    log.observe(15.0, _stats(generated_tokens_total=60))  # idle through it: silent
    log.observe(30.0, _stats(generated_tokens_total=60))
    assert len(caplog.records) == 2


@pytest.fixture
def logged_server(tiny_model_dir, caplog):
    caplog.set_level(logging.INFO, logger="radixlang.server")
    engine = Engine(model=str(tiny_model_dir), device="cpu", kv_cache_tokens=4096, compile_layers=False)
    try:
        with background_server(engine, log_requests=True) as server:
            yield engine, server
        engine.check_invariants()
    finally:
        engine.shutdown()


def test_the_banner_states_the_model_its_pool_and_url_and_requests_and_shutdown_are_logged(
        logged_server, tiny_model_dir, caplog):
    engine, server = logged_server
    started = caplog.get_records("setup")  # the server started in the fixture
    banner = next(r.getMessage() for r in started if r.getMessage().startswith("radixlang serving: "))
    fields = dict(part.split("=", 1) for part in banner.removeprefix("radixlang serving: ").split(", "))
    head_dim = TINY_CONFIG["hidden_size"] // TINY_CONFIG["num_attention_heads"]
    kv_bytes = 4096 * 2 * TINY_CONFIG["num_hidden_layers"] * TINY_CONFIG["num_key_value_heads"] * head_dim * 4  # fp32
    assert kv_bytes == 2 * 2**20
    assert fields["kv_pool"] == "4096 tokens (2.0 MB)"
    assert fields["model"] == str(tiny_model_dir) and fields["format"] == "HF folder"
    assert fields["context_length"] == str(TINY_CONFIG["max_position_embeddings"])
    assert fields["url"] == server.url and fields["api_keys"] == "off"
    assert fields["dtype"] == "float32" and fields["device"] == "cpu" and "packed int4/int8 + " in fields["cpu_paths"]
    assert fields["quantization"] == "auto (weights as stored)" and fields["compile"] == "off (eager decode)"
    assert list(fields)[:3] == ["version", "model", "format"]

    long_text = "tell me " * 400  # 3200 characters: logged truncated, with the body's size
    with httpx.Client(base_url=server.url, timeout=60) as client:
        assert client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}).status_code == 200
        assert client.post("/generate", json={"text": long_text, "sampling_params": {"max_new_tokens": 1}}
                           ).status_code == 200
    requests = [r.getMessage() for r in caplog.records if r.name == "radixlang.server.requests"]
    assert requests[0] == 'request POST /generate {"text":"hi","sampling_params":{"max_new_tokens":2}}'
    body_len = len(httpx.Request("POST", "http://x", json={"text": long_text, "sampling_params": {"max_new_tokens": 1}}
                                 ).content)
    assert requests[1].endswith(f" ... ({body_len} bytes)") and len(requests[1]) < 2100


def test_the_server_logs_a_shutdown_line(tiny_model_dir, caplog):
    caplog.set_level(logging.INFO, logger="radixlang.server")
    with Engine(model=str(tiny_model_dir), device="cpu", kv_cache_tokens=1024, compile_layers=False) as engine:
        with background_server(engine) as server, httpx.Client(base_url=server.url, timeout=60) as client:
            client.post("/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 3, "ignore_eos": True}})
    last = caplog.records[-1].getMessage()
    assert last.startswith("radixlang server stopped after ") and "1 requests finished, 0 aborted, 3 tokens" in last
