"""Serving an engine with uvicorn, with a graceful shutdown that finishes or aborts what is in flight."""
from __future__ import annotations

import asyncio
import contextlib
import signal
import socket
import threading
import time
from typing import Iterator

import uvicorn

from ..runtime.engine import Engine
from .app import create_app
from .auth import AuthConfig
from .config import DEFAULT_HOST, DEFAULT_PORT, GRACEFUL_SHUTDOWN_S, SHUTDOWN_MARGIN_S
from .limits import ServerLimits
from .server_log import configure_logging
from .state import ServerState

DRAIN_POLL_S = 0.05

class DrainingServer(uvicorn.Server):
    """uvicorn that, on shutdown, lets requests in flight finish for `grace_s` seconds and then aborts
    them through the engine, so each client still gets a final (abort) response, not a cut connection.
    While it drains it still accepts connections: /health answers 503 (a load balancer sees the server
    going) and new requests get a 503, instead of a refused connection."""

    def __init__(self, config: uvicorn.Config, state: ServerState, grace_s: float):
        super().__init__(config)
        self.state, self.grace_s = state, grace_s
        self.url: str | None = None  # set once it listens (background_server)

    async def shutdown(self, sockets: list[socket.socket] | None = None) -> None:
        self.state.begin_drain(self.grace_s)
        await self._drain()
        await super().shutdown(sockets)

    async def _drain(self) -> None:
        """Waits, still listening, until no request is in flight: they finish, or are aborted after
        the grace period and send their last event. A second SIGINT (force_exit) stops waiting."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.grace_s + SHUTDOWN_MARGIN_S
        while self.server_state.tasks and not self.force_exit and loop.time() < deadline:
            await asyncio.sleep(DRAIN_POLL_S)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        """SIGINT/SIGTERM start the graceful shutdown (a second SIGINT forces it). Unlike uvicorn's
        own, this does not re-raise the signal afterwards: the caller still has an engine to close."""
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        signals = (signal.SIGINT, signal.SIGTERM)
        previous = {sig: signal.signal(sig, self.handle_exit) for sig in signals}
        try:
            yield
        finally:
            for sig, handler in previous.items():
                signal.signal(sig, handler)


def make_server(engine: Engine, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, *,
                served_model_name: str | None = None, grace_s: float = GRACEFUL_SHUTDOWN_S,
                log_level: str = "info", limits: ServerLimits | None = None,
                incremental_streaming_output: bool = False, log_requests: bool = False,
                auth: AuthConfig | None = None, ssl_keyfile: str | None = None,
                ssl_certfile: str | None = None) -> DrainingServer:
    """`auth`: API keys (server/auth.py); `ssl_keyfile` / `ssl_certfile`: serve HTTPS (PEM files)."""
    if grace_s < 0:
        raise ValueError(f"graceful shutdown time must be >= 0 seconds, got {grace_s}")
    if (ssl_keyfile is None) != (ssl_certfile is None):
        raise ValueError("TLS needs both --ssl-keyfile and --ssl-certfile")
    app = create_app(engine, served_model_name, limits, incremental_streaming_output, log_requests, auth)
    app.state.server.url = base_url(host, port, https=ssl_certfile is not None)
    config = uvicorn.Config(app, host=host, port=port, log_level=log_level, lifespan="on",
                            ssl_keyfile=ssl_keyfile, ssl_certfile=ssl_certfile,
                            # uvicorn annotates int, but waits with asyncio.timeout, which takes seconds as a float
                            timeout_graceful_shutdown=grace_s + SHUTDOWN_MARGIN_S)  # type: ignore[arg-type]
    return DrainingServer(config, app.state.server, grace_s)


def base_url(host: str, port: int, https: bool = False) -> str:
    name = f"[{host}]" if ":" in host else host  # an IPv6 address goes in brackets
    return f"{'https' if https else 'http'}://{name}:{port}"


def serve(engine: Engine, host: str = DEFAULT_HOST, port: int = DEFAULT_PORT, **kwargs) -> None:
    """Runs the server until SIGINT/SIGTERM; returns after a graceful shutdown (the engine stays up).
    Logs as `radixlang serve` does: the banner, step lines and uvicorn's lines at `log_level`."""
    configure_logging(kwargs.get("log_level", "info"))
    make_server(engine, host, port, **kwargs).run()


@contextlib.contextmanager
def background_server(engine: Engine, host: str = DEFAULT_HOST, port: int = 0,
                      **kwargs) -> Iterator[DrainingServer]:
    """Serves `engine` from a thread (port 0: any free port) until the block ends, then shuts down
    gracefully. The server's `url` is its base URL. For notebooks and tests."""
    kwargs.setdefault("log_level", "warning")
    server = make_server(engine, host, port, **kwargs)
    sock = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind((host, port))
    # before it starts: the banner names it
    server.state.url = base_url(host, sock.getsockname()[1], https=server.config.ssl_certfile is not None)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, name="radixlang-http", daemon=True)
    thread.start()
    while not server.started:
        if not thread.is_alive():
            sock.close()
            raise RuntimeError("the HTTP server failed to start")
        time.sleep(0.01)
    server.url = server.state.url
    try:
        yield server
    finally:
        server.should_exit = True
        thread.join()
        sock.close()
