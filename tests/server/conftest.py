"""A real uvicorn server on a free loopback port, serving an in-process tiny engine."""
from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from dataclasses import dataclass
from typing import Any, Iterator

import httpx
import pytest

from radixlang.runtime.engine import Engine
from radixlang.server.auth import AuthConfig
from radixlang.server.launch import DrainingServer, background_server
from radixlang.server.limits import ServerLimits

# RADIXLANG_TEST_API_KEY=k: every test server requires the (admin) key k, and LiveServer.client sends it; the
# hardening and fuzz tests run so to show keys change nothing else (tests that build their own clients do not)
TEST_KEY = os.environ.get("RADIXLANG_TEST_API_KEY")


@dataclass
class LiveServer:
    url: str
    engine: Engine
    server: DrainingServer

    def client(self, **kwargs: Any) -> httpx.Client:
        if TEST_KEY:
            kwargs["headers"] = {"Authorization": f"Bearer {TEST_KEY}"} | kwargs.get("headers", {})
        return httpx.Client(base_url=self.url, timeout=kwargs.pop("timeout", 60), **kwargs)

    def wait_idle(self, timeout: float = 20.0) -> dict[str, float]:
        """Waits until no request runs or waits, then checks the KV invariant and that the server
        holds no request id any more."""
        deadline = time.monotonic() + timeout
        while True:
            stats = self.engine.stats()
            if stats["running_requests"] == 0 and stats["waiting_requests"] == 0 and not self.live.rids:
                break
            assert time.monotonic() < deadline, f"server never went idle: {stats}, live {self.live.groups}"
            time.sleep(0.01)
        self.engine.check_invariants()
        assert stats["kv_free_tokens"] + stats["kv_cached_tokens"] == stats["kv_pool_tokens"]
        return stats

    @property
    def live(self):
        return self.server.state.live


@contextlib.contextmanager
def serving(model_dir, grace_s: float = 5.0, limits: ServerLimits | None = None,
            incremental_streaming_output: bool = False, auth: AuthConfig | None = None,
            **options: Any) -> Iterator[LiveServer]:
    options.setdefault("kv_cache_tokens", 4096)
    options.setdefault("device", "cpu")
    # eager unless a test asks: under "auto" a compile marker left by another test (a `serve --compile-layers
    # true` subprocess) made this server compile in the background, and the profile tests saw compiled graphs
    options.setdefault("compile_layers", False)
    if TEST_KEY and auth is None:  # the suite's own requests carry it (LiveServer.client): a non-default namespace
        auth = AuthConfig({}, (TEST_KEY,))
    engine = Engine(model=str(model_dir), **options)
    try:
        with background_server(engine, grace_s=grace_s, limits=limits, auth=auth,
                               incremental_streaming_output=incremental_streaming_output) as server:
            yield LiveServer(server.url, engine, server)
        engine.check_invariants()
    finally:
        engine.shutdown()


@pytest.fixture(scope="module")
def live_server(tiny_model_dir) -> Iterator[LiveServer]:
    with serving(tiny_model_dir) as live:
        yield live


@pytest.fixture
def server(live_server) -> Iterator[LiveServer]:
    """The module's server; each test ends with it idle, its KV accounted for."""
    yield live_server
    live_server.wait_idle()


@pytest.fixture
def server_factory(tiny_model_dir):
    """Starts extra servers with their own engine options (and `limits`, `grace_s`, server options); each is checked
    and stopped afterwards."""
    stack = contextlib.ExitStack()

    def make(**options: Any) -> LiveServer:
        return stack.enter_context(serving(tiny_model_dir, **options))

    with stack:
        yield make


def sse_events(response: httpx.Response) -> list[Any]:
    """The JSON payloads of a server-sent event stream, ending with the literal '[DONE]'."""
    events = []
    for line in response.iter_lines():
        if not line:
            continue
        assert line.startswith("data: "), line
        data = line[len("data: "):]
        events.append(data if data == "[DONE]" else json.loads(data))
    return events


@pytest.fixture
def read_sse():
    return sse_events


def generate_stream_in_thread(url: str, body: dict) -> tuple[threading.Thread, list[str]]:
    """Streams POST {url}/generate from a thread, collecting its non-empty lines; returns once the
    first event has arrived, so the request is running."""
    lines: list[str] = []
    started = threading.Event()

    def read() -> None:
        with httpx.Client(base_url=url, timeout=60) as http, \
                http.stream("POST", "/generate", json=body | {"stream": True}) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)
                    started.set()

    thread = threading.Thread(target=read)
    thread.start()
    assert started.wait(30), "the stream produced nothing"
    return thread, lines


@pytest.fixture
def stream_in_thread():
    return generate_stream_in_thread
