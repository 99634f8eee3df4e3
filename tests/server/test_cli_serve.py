"""`radixlang serve` as a real process: it answers, and exits cleanly on SIGTERM."""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time

import httpx
import openai

from radixlang.server.cli import _engine_options, _limits, build_parser
from radixlang.server.limits import ServerLimits

from ..conftest import OUTLASTS_GRACE_KV_TOKENS, OUTLASTS_GRACE_TOKENS, STALL_THE_COMPILE


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_flags_become_engine_options():
    args = build_parser().parse_args(["serve", "--port", "8123", "--kv-cache-tokens", "512",
                                      "--schedule-policy", "fcfs", "--disable-radix-cache", "--mem-fraction", "0.2"])
    assert args.port == 8123 and args.host == "127.0.0.1"
    assert _engine_options(args) == {"kv_cache_tokens": 512, "schedule_policy": "fcfs",
                                     "disable_radix_cache": True, "mem_fraction": 0.2}


def test_serve_flags_become_request_limits_with_the_defaults_for_the_rest():
    args = build_parser().parse_args(["serve", "--max-prompts", "8", "--max-program-seconds", "2.5"])
    assert _limits(args) == ServerLimits(max_prompts=8, max_program_seconds=2.5)


def test_incremental_streaming_output_is_sglangs_flag_and_reaches_fleet_workers():
    from radixlang.server.fleet import worker_flags

    assert build_parser().parse_args(["serve"]).incremental_streaming_output is False
    args = build_parser().parse_args(["serve", "--incremental-streaming-output"])
    assert args.incremental_streaming_output is True
    flags = list(worker_flags({"incremental_streaming_output": args.incremental_streaming_output}))
    assert build_parser().parse_args(["serve", *flags]).incremental_streaming_output is True


def test_serve_rejects_a_bad_limit_before_loading_the_model():
    res = subprocess.run([sys.executable, "-m", "radixlang.server.cli", "serve", "--model", "/no/such/model",
                          "--max-sequences", "0"], capture_output=True, text=True, timeout=120)
    assert res.returncode == 2 and "max_sequences must be a number > 0, got 0" in res.stderr


def test_serve_rejects_a_bad_engine_option_with_a_clear_error(tiny_model_dir):
    res = subprocess.run([sys.executable, "-m", "radixlang.server.cli", "serve", "--model",
                          str(tiny_model_dir), "--mem-fraction", "2"],  # a value set (--schedule-policy) the parser
                         capture_output=True, text=True, timeout=120)  # checks itself: test_cli_help.py
    assert res.returncode == 2 and "mem_fraction must be in (0, 0.95], got 2.0" in res.stderr


def _wait_healthy(proc: subprocess.Popen, url: str) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None, proc.communicate()[1]
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        assert time.monotonic() < deadline, "server did not come up"
        time.sleep(0.2)


def test_serve_answers_requests_and_on_sigterm_drains_then_exits_cleanly(long_tiny_model_dir, stream_in_thread):
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixlang.server.cli", "serve", "--model", str(long_tiny_model_dir),
         "--port", str(port), "--device", "cpu", "--kv-cache-tokens", str(OUTLASTS_GRACE_KV_TOKENS),
         "--served-model-name", "tiny", "--graceful-timeout", "2", "--log-level", "warning",
         "--compile-layers", "false"],  # serve compiles in the background by default: not what this tests
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url)
        with openai.OpenAI(base_url=f"{url}/v1", api_key="unused", max_retries=0) as client:
            assert [m.id for m in client.models.list().data] == ["tiny"]
            out = client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "Hi"}],
                                                 max_tokens=5, extra_body={"ignore_eos": True})
        assert out.usage.completion_tokens == 5
        # still running when SIGTERM comes: aborted after the grace period
        reader, lines = stream_in_thread(url, {"text": "go", "sampling_params": {
            "max_new_tokens": OUTLASTS_GRACE_TOKENS, "ignore_eos": True}})
        proc.send_signal(signal.SIGTERM)
        reader.join(30)
        assert proc.wait(timeout=30) == 0
        assert lines[-1] == "data: [DONE]" and json.loads(lines[-2][6:])["meta_info"]["finish_reason"]["type"] == "abort"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


SERVE = STALL_THE_COMPILE + """
import os, sys
from radixlang.server.cli import main


def _say_stalled():
    STALLED.wait()
    open(os.environ["STALLED_FLAG"], "w").close()


threading.Thread(target=_say_stalled, daemon=True).start()
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_during_a_background_compile_cancels_it_and_exits_cleanly(tiny_model_dir, tmp_path):
    """A thread left inside the compiler when the interpreter exits aborts the process (exit 134)."""
    port = free_port()
    stalled = tmp_path / "stalled"  # the child makes it once its compile is held inside torch
    env = dict(os.environ, RADIXLANG_CACHE_DIR=str(tmp_path), STALLED_FLAG=str(stalled))  # a cold compile
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE, "serve", "--model", str(tiny_model_dir), "--port", str(port), "--device", "cpu",
         "--kv-cache-tokens", "256", "--graceful-timeout", "1", "--log-level", "warning", "--compile-layers", "true"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url)
        assert httpx.get(f"{url}/server_info", timeout=5).json()["decode_compile"] == "compiling"
        deadline = time.monotonic() + 120
        while not stalled.exists():  # the compile starts once the server has been idle for a second
            assert proc.poll() is None and time.monotonic() < deadline, "the compile never reached torch's tracing"
            time.sleep(0.1)
        proc.send_signal(signal.SIGTERM)
        stderr = proc.communicate(timeout=120)[1]
        assert proc.returncode == 0 and "terminate called" not in stderr, stderr[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_serve_logs_its_banner_before_health_answers_and_a_shutdown_line(tiny_model_dir):
    import threading

    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "radixlang.server.cli", "serve", "--model", str(tiny_model_dir), "--port", str(port),
         "--device", "cpu", "--kv-cache-tokens", "512", "--compile-layers", "false", "--log-requests"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lines: list[tuple[float, str]] = []  # (when read, line) of stderr
    reader = threading.Thread(target=lambda: lines.extend((time.monotonic(), line) for line in proc.stderr), daemon=True)
    reader.start()
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_healthy(proc, url)
        healthy_at = time.monotonic()
        httpx.post(f"{url}/generate", json={"text": "hi", "sampling_params": {"max_new_tokens": 2}}, timeout=60)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=60) == 0
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    banner = [(t, line) for t, line in lines if "radixlang serving: " in line]
    assert len(banner) == 1 and banner[0][0] < healthy_at, [line for _, line in lines]
    text = banner[0][1]
    for field in (f"model={tiny_model_dir}", "format=HF folder", "kv_pool=512 tokens (", "context_length=1024",
                  f"url=http://127.0.0.1:{port}", "api_keys=off", "quantization="):
        assert field in text, (field, text)
    assert " INFO " in text  # at info level, on stderr, with the time
    # the banner precedes uvicorn's own start-up lines too: it is logged while the app starts
    started = next(i for i, (_, line) in enumerate(lines) if "Uvicorn running on" in line)
    assert lines.index(banner[0]) < started
    assert any('request POST /generate {"text":"hi"' in line for _, line in lines)
    stopped = [line for _, line in lines if "radixlang server stopped after " in line]
    assert len(stopped) == 1 and "1 requests finished, 0 aborted, 2 tokens generated" in stopped[0], stopped
