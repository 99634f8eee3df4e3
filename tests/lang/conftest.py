"""Language tests share one tiny engine (building one takes about a second); each test starts with an
empty prefix cache and ends with the KV memory invariant checked."""
from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import pytest

import radixlang as rl


@pytest.fixture(scope="session")
def shared_tiny_engine(tiny_model_dir):
    from radixlang.runtime.engine import Engine

    engine = Engine(model=str(tiny_model_dir), kv_cache_tokens=8192, device="cpu")
    yield engine
    engine.check_invariants()
    engine.shutdown()


@pytest.fixture
def engine(shared_tiny_engine):
    shared_tiny_engine.flush_cache()
    yield shared_tiny_engine
    shared_tiny_engine.check_invariants()


@pytest.fixture
def backend(engine) -> rl.EngineBackend:
    return rl.EngineBackend(engine)


@pytest.fixture(scope="session")
def oracle_engine(tiny_model_dir):
    """The same tiny model without a prefix cache: every request computes its prompt from scratch."""
    from radixlang.runtime.engine import Engine

    engine = Engine(model=str(tiny_model_dir), kv_cache_tokens=8192, device="cpu", disable_radix_cache=True)
    yield engine
    engine.check_invariants()
    engine.shutdown()


@pytest.fixture(scope="session")
def server_url(shared_tiny_engine):
    """The HTTP server (runtime/server) over the shared tiny engine, for the Endpoint client."""
    from radixlang.runtime.server.launch import background_server

    with background_server(shared_tiny_engine) as server:
        yield server.url


class ProgramsServer:
    """Serves POST /v1/programs the way the HTTP server is to (issue 4): `run_ir` over the engine,
    each event as a server-sent event. A stand-in until runtime/server has the route."""

    def __init__(self, engine):
        engine_backend = rl.EngineBackend(engine)

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                try:
                    events = rl.run_ir(body["program"], body.get("args", {}), engine_backend,
                                       body.get("sampling_params"))
                except ValueError as e:
                    data = json.dumps({"error": {"message": str(e)}}).encode()
                    self.send_response(400)
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.end_headers()
                for event in events:
                    self.wfile.write(b"data: " + json.dumps(event.to_dict()).encode() + b"\n\n")
                    self.wfile.flush()
                self.wfile.write(b"data: [DONE]\n\n")

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def programs_server(engine):
    server = ProgramsServer(engine)
    yield server
    server.close()
