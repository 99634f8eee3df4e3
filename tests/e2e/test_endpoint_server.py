"""The Endpoint client against `radixlang serve` (issue 4) in its own process, on the tiny model."""
from __future__ import annotations

import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest

import radixlang as rl

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def server_url(tiny_model_dir):
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "radixlang.server.cli", "serve", "--model",
                             str(tiny_model_dir), "--host", "127.0.0.1", "--port", str(port),
                             "--compile-layers", "false"])  # no background compile in the test run
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "/health", timeout=1):
                break
        except OSError:
            assert proc.poll() is None, "the server exited during startup"
            time.sleep(0.2)
    else:
        proc.terminate()
        pytest.fail("the server did not become healthy in 120 s")
    yield url
    proc.terminate()
    proc.wait(timeout=30)


@pytest.fixture(scope="module")
def local(tiny_model_dir):
    from radixlang.runtime.engine import Engine

    engine = Engine(model=str(tiny_model_dir), kv_cache_tokens=8192, device="cpu")
    yield rl.EngineBackend(engine)
    engine.check_invariants()
    engine.shutdown()


@rl.function
def program(s, question):
    s += "Question: " + question + "\nAnswer:" + rl.gen("answer", max_tokens=8, temperature=0)
    forks = s.fork(2)
    forks += lambda i: f" Option {i}:" + rl.gen("option", max_tokens=4, temperature=0)
    forks.join()
    s += " Best:" + rl.select("best", [" first", " second", " neither"])


def test_endpoint_runs_programs_like_the_in_process_engine(server_url, local):
    endpoint = rl.Endpoint(server_url)
    remote = program.run(question="Why?", backend=endpoint)
    here = program.run(question="Why?", backend=local)
    assert remote.error() is None
    assert remote.text() == here.text()
    assert (remote["answer"], remote["option"], remote["best"]) == (here["answer"], here["option"], here["best"])
    assert remote.get_meta_info("best")["normalized_prompt_logprobs"] == pytest.approx(
        here.get_meta_info("best")["normalized_prompt_logprobs"], abs=1e-3)
    streamed = program.run(question="Why?", backend=endpoint, stream=True)
    assert "".join(streamed.text_iter()) == here.text()


def test_remote_program_runs_server_side(server_url, local):
    remote = program.run(question="Why?", backend=rl.Endpoint(server_url), remote=True)
    here = program.run(question="Why?", backend=local)
    assert remote.error() is None
    assert remote.text() == here.text() and remote["option"] == here["option"]
