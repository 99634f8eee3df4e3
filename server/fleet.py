"""`radixlang serve --dp N`: N engine processes, each a plain `radixlang serve` on its own port with its
share of the threads (or one GPU each), behind SGLang's router (`sglang-router`, the smg core) on the
public port with its cache-aware policy.

The router is a separate process from an optional wheel (`pip install sglang-router`). SIGTERM or
SIGINT stops the router first (no new traffic), then the workers, which drain as a single server does.

With API keys (server/auth.py) the workers check them: they bind to loopback, get the keys in a file only
this user can read (the admin key in their environment), never on a command line, and the router forwards
each client's own Authorization header, so each worker sees the tenant. The router gets no key of its own:
sglang-router's --api-key puts its key in front of the client's on every request it forwards, which would
make every request the router's. With --ssl-certfile the router serves HTTPS (its --tls-cert-path).
"""
from __future__ import annotations

import dataclasses
import importlib.util
import json
import logging
import math
import os
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from typing import Sequence

from .auth import ADMIN_KEY_ENV, KEY_ENV, AuthConfig
from .config import HEALTH_TIMEOUT_S

logger = logging.getLogger(__name__)

ROUTER_MODULE = "sglang_router"
INSTALL_HINT = "pip install sglang-router  (from a radixlang checkout: pip install -e '.[router]')"
STARTUP_TIMEOUT_S = 600.0  # a worker loads and warms its model within this
POLL_S = 0.2
HEALTH_CHECK_INTERVAL_S = 2  # the router probes each worker this often: a dead one leaves within seconds
# A worker's /health waits for its scheduler thread to answer between steps (HEALTH_TIMEOUT_S at most), and a
# long prefill step on a busy CPU takes more than the router's default 5 s: with that, the router took a
# busy worker for a dead one. So the worker's own answer decides; a dead worker still refuses at once.
HEALTH_CHECK_TIMEOUT_S = math.ceil(HEALTH_TIMEOUT_S) + 5
MAX_RESTARTS = 3  # a worker that dies is started again this many times at most
STOP_MARGIN_S = 15.0  # after the drain grace period, a process still running is killed


@dataclasses.dataclass(slots=True)
class FleetSpec:
    host: str
    port: int  # the router's (public) port
    dp: int
    worker_args: list[str]  # `radixlang serve` options each worker gets (engine, limits, model name, ...)
    policy: str = "cache_aware"
    threads_per_worker: int | None = None  # None: the machine's cores split evenly
    grace_s: float = 30.0
    router_args: list[str] = dataclasses.field(default_factory=list)  # extra sglang-router options
    log_level: str = "info"
    auth: AuthConfig = dataclasses.field(default_factory=AuthConfig)  # the keys the workers check
    ssl_keyfile: str | None = None  # the router serves HTTPS with these (PEM)
    ssl_certfile: str | None = None


def router_available() -> bool:
    return importlib.util.find_spec(ROUTER_MODULE) is not None


def require_router() -> None:
    if not router_available():
        raise ValueError(f"--dp needs SGLang's router, which is not installed: {INSTALL_HINT}")


def free_port(host: str) -> int:
    """A port free on `host` now (the OS picks it; another process may still take it before we bind)."""
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def url(host: str, port: int) -> str:
    return f"http://[{host}]:{port}" if ":" in host else f"http://{host}:{port}"


class Fleet:
    """The worker and router processes of one `serve --dp N`; `start` waits until the router serves."""

    def __init__(self, spec: FleetSpec):
        require_router()
        if spec.dp < 1:
            raise ValueError(f"--dp must be >= 1, got {spec.dp}")
        self.spec = spec
        self.worker_urls: list[str] = []
        self.workers: list[subprocess.Popen] = []
        self.commands: list[list[str]] = []  # each worker's command line and environment, to restart it
        self.envs: list[dict[str, str]] = []
        self.router: subprocess.Popen | None = None
        self.more_routers: list[subprocess.Popen] = []  # add_router's
        self.metrics_port: int | None = None
        self.keys_file: str | None = None  # the workers' keys (deleted on stop)

    @property
    def url(self) -> str:
        base = url(self.spec.host, self.spec.port)
        return base.replace("http://", "https://", 1) if self.spec.ssl_certfile else base

    def start(self) -> None:
        try:
            for i in range(self.spec.dp):
                self._start_worker(i)
            for proc, worker in zip(self.workers, self.worker_urls):
                wait_healthy(worker, proc, "/health")
            self._start_router()
            wait_router(self.url, self.router, len(self.worker_urls))
        except BaseException:
            self.stop()
            raise

    def _start_worker(self, i: int) -> None:
        spec = self.spec
        host = "::1" if ":" in spec.host else "127.0.0.1"  # only the router needs to reach a worker
        port = free_port(host)
        on_cpu = "cpu" in (spec.worker_args[j + 1] for j, a in enumerate(spec.worker_args[:-1]) if a == "--device")
        env = dict(os.environ, **worker_env(i, spec.dp, spec.threads_per_worker, use_gpus=not on_cpu))
        cmd = [sys.executable, "-m", "radixlang", "serve", "--host", host, "--port", str(port),
               "--graceful-timeout", str(spec.grace_s), "--log-level", spec.log_level, *spec.worker_args]
        env.pop(KEY_ENV, None)  # the keys file holds it
        env.pop(ADMIN_KEY_ENV, None)
        if spec.auth.keys:
            cmd += ["--api-keys-file", self._keys_file()]
        if spec.auth.admin_keys:
            env[ADMIN_KEY_ENV] = spec.auth.admin_keys[0]
        self.commands.append(cmd)
        self.envs.append(env)
        self.workers.append(self._launch(cmd, env))
        self.worker_urls.append(url(host, port))

    def _keys_file(self) -> str:
        """The tenant keys, `KEY TENANT` a line, in a file only this user reads (written once)."""
        if self.keys_file is None:
            fd, self.keys_file = tempfile.mkstemp(prefix="radixlang-keys-", text=True)  # mode 0600
            with os.fdopen(fd, "w") as f:
                f.writelines(f"{key} {tenant}\n" for key, tenant in self.spec.auth.keys.items())
        return self.keys_file

    @staticmethod
    def _launch(cmd: list[str], env: dict[str, str]) -> subprocess.Popen:
        return subprocess.Popen(cmd, env=env, preexec_fn=_die_with_parent)  # noqa: PLW1509 - it only calls prctl

    def _start_router(self) -> None:
        self.metrics_port = free_port(self.spec.host)  # its default, 0.0.0.0:29000, clashes and is public
        cmd = router_command(self.spec, self.worker_urls, self.spec.port, self.spec.policy, self.metrics_port)
        self.router = subprocess.Popen(cmd, preexec_fn=_die_with_parent)  # noqa: PLW1509 - it only calls prctl

    def add_router(self, policy: str) -> str:
        """Another router, with `policy`, in front of the same workers on a free port, stopped with the
        fleet; its URL once it serves. benchmark/scale_out.py compares policies on the same worker processes."""
        port = free_port(self.spec.host)
        cmd = router_command(self.spec, self.worker_urls, port, policy, free_port(self.spec.host))
        self.more_routers.append(subprocess.Popen(cmd, preexec_fn=_die_with_parent))  # noqa: PLW1509 - prctl only
        wait_router(url(self.spec.host, port), self.more_routers[-1], len(self.worker_urls))
        return url(self.spec.host, port)

    def wait(self) -> int:
        """Blocks until the router exits (or a signal stops the fleet). A worker that dies is started again
        on its port (MAX_RESTARTS times at most); meanwhile the router's retries and health check send its
        traffic to the others, and once it answers /health again the router routes to it again."""
        restarts = [0] * len(self.workers)
        while self.router is not None and self.router.poll() is None:
            for i, proc in enumerate(self.workers):
                if proc.poll() is None or restarts[i] >= MAX_RESTARTS:
                    continue
                restarts[i] += 1
                logger.warning("worker %s exited with %s; starting it again (%d of %d)", self.worker_urls[i],
                               proc.returncode, restarts[i], MAX_RESTARTS)
                self.workers[i] = self._launch(self.commands[i], self.envs[i])
            time.sleep(POLL_S)
        return 0 if self.router is None else self.router.returncode or 0

    def stop(self) -> None:
        """The routers first: they take no new requests and finish those in flight (within the grace period);
        then every worker drains and exits."""
        routers = ([self.router] if self.router else []) + self.more_routers
        for router in routers:
            if router.poll() is None:
                router.send_signal(signal.SIGTERM)
        for router in routers:
            _wait_or_kill(router, self.spec.grace_s + STOP_MARGIN_S)
        for proc in self.workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.spec.grace_s + STOP_MARGIN_S
        for proc in self.workers:
            _wait_or_kill(proc, max(0.0, deadline - time.monotonic()))
        if self.keys_file is not None:
            os.unlink(self.keys_file)
            self.keys_file = None


def router_command(spec: FleetSpec, worker_urls: list[str], port: int, policy: str, metrics_port: int) -> list[str]:
    """The command line of SGLang's router on `spec.host:port` in front of `worker_urls` with `policy`
    (benchmark/scale_out.py starts a second one, with another policy, in front of the same workers)."""
    return [sys.executable, "-m", f"{ROUTER_MODULE}.launch_router", "--host", spec.host,
            "--port", str(port), "--worker-urls", *worker_urls, "--policy", policy,
            "--prometheus-host", spec.host, "--prometheus-port", str(metrics_port),
            "--health-check-interval-secs", str(HEALTH_CHECK_INTERVAL_S),
            "--health-check-timeout-secs", str(HEALTH_CHECK_TIMEOUT_S),
            # it finishes what is in flight within the workers' grace, then the workers drain in turn
            "--shutdown-grace-period-secs", str(max(1, math.ceil(spec.grace_s))),
            "--log-level", "warn" if spec.log_level in ("warning", "error", "critical") else spec.log_level,
            *(["--tls-cert-path", spec.ssl_certfile, "--tls-key-path", spec.ssl_keyfile]
              if spec.ssl_certfile and spec.ssl_keyfile else []),
            *spec.router_args]


def _die_with_parent() -> None:
    """In the child, before exec: SIGTERM it when the fleet process dies, even by SIGKILL (Linux), so no
    worker outlives its fleet."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def worker_env(index: int, dp: int, threads: int | None, use_gpus: bool = True) -> dict[str, str]:
    """Worker `index`'s share of the machine: its threads (CPU) and, with GPUs (unless `--device cpu`),
    one device each."""
    cores = os.cpu_count() or 1
    env = {"OMP_NUM_THREADS": str(threads or max(1, cores // dp))}
    gpus = _visible_gpus() if use_gpus else []
    if gpus:
        if len(gpus) < dp:
            raise ValueError(f"--dp {dp} needs {dp} GPUs, {len(gpus)} are visible")
        env["CUDA_VISIBLE_DEVICES"] = gpus[index]
    return env


def _visible_gpus() -> list[str]:
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        return [g for g in visible.split(",") if g.strip()]
    try:
        import torch
    except ImportError:
        return []
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def wait_healthy(base: str, proc: subprocess.Popen | None, path: str, timeout: float = STARTUP_TIMEOUT_S) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the process serving {base} exited with {proc.returncode} before it was healthy")
        if _get(base + path) is not None:
            return
        time.sleep(POLL_S)
    raise RuntimeError(f"{base}{path} was not healthy within {timeout:.0f} s")


def wait_router(base: str, proc: subprocess.Popen | None, workers: int, timeout: float = STARTUP_TIMEOUT_S) -> None:
    """Until the router lists `workers` healthy workers (it adds them in the background)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the router exited with {proc.returncode} before it served")
        if healthy_workers(base) >= workers:
            return
        time.sleep(POLL_S)
    raise RuntimeError(f"the router at {base} did not list {workers} healthy workers within {timeout:.0f} s")


def healthy_workers(base: str) -> int:
    body = _get(base + "/workers")
    if not isinstance(body, dict):
        return 0
    return sum(1 for w in body.get("workers", []) if w.get("is_healthy", True))


def _get(address: str) -> object | None:
    # our own router, polled on its own address: its certificate may be one a client trusts by its name only
    context = ssl._create_unverified_context() if address.startswith("https:") else None  # noqa: S323
    try:
        with urllib.request.urlopen(address, timeout=5, context=context) as response:
            raw = response.read()
    except (urllib.error.URLError, OSError):
        return None
    try:
        return json.loads(raw)
    except ValueError:
        return raw


def _wait_or_kill(proc: subprocess.Popen, timeout: float) -> None:
    try:
        proc.wait(timeout)
    except subprocess.TimeoutExpired:
        logger.warning("process %d did not exit in time; killing it", proc.pid)
        proc.kill()
        proc.wait()


def serve_fleet(spec: FleetSpec) -> int:
    """Runs the fleet until SIGTERM/SIGINT (or the router exits), then stops it all."""
    fleet = Fleet(spec)

    def stop(signum: int, frame: object) -> None:
        raise KeyboardInterrupt

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        fleet.start()
        print(f"radixlang: router at {fleet.url} in front of {', '.join(fleet.worker_urls)}", flush=True)
        return fleet.wait()
    except KeyboardInterrupt:
        return 0
    finally:
        for sig in (signal.SIGINT, signal.SIGTERM):  # a second signal must not cut the shutdown short
            signal.signal(sig, signal.SIG_IGN)
        fleet.stop()
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def worker_flags(options: dict[str, object]) -> Sequence[str]:
    """`--name value` flags (a True bool: the bare flag) for options named as dataclass fields."""
    flags: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if value is True:
            flags.append(flag)
        elif value is not None and value is not False:
            flags += [flag, str(value)]
    return flags
