"""What the HTTP layer keeps next to the engine: live request ids, throughput samples, draining."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import os
import time
from collections import deque
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import AsyncIterator, Callable, Iterator, Protocol, TypeVar

from fastapi import Request

from ..runtime.engine import Engine
from .config import METRICS_SAMPLE_INTERVAL_S, METRICS_WINDOW_S
from .errors import APIError
from .limits import ServerLimits
from .server_log import StepLog, banner, shutdown_line
from .server_log import logger as server_log

logger = logging.getLogger(__name__)
T = TypeVar("T")


class Cancellable(Protocol):
    def cancel(self) -> None: ...


@dataclass
class LiveRequests:
    """Request ids in flight, grouped by the id a client can abort them by (an SGLang rid or an
    OpenAI response id) -> the engine ids of its samples. Touched only on the event loop."""

    engine: Engine
    groups: dict[str, list[str]] = field(default_factory=dict)
    rids: set[str] = field(default_factory=set)
    owners: dict[str, str] = field(default_factory=dict)  # a group's or sample's id -> its tenant's id

    def check(self, groups: dict[str, list[str]]) -> None:
        """Raises a 400 unless every id is new: unique in the request (a sample may share only its
        own group's id) and not in use by a request in flight."""
        samples = [r for rids in groups.values() for r in rids]
        clash = any(r != key and r in groups for key, rids in groups.items() for r in rids)
        if clash or len(set(samples)) != len(samples):
            raise APIError(400, "request ids must be unique within a request", "rid")
        for key in [*groups, *samples]:
            if key in self.groups or key in self.rids:
                raise APIError(400, f"request id {key!r} is already in use", "rid")

    @contextlib.contextmanager
    def claim(self, groups: dict[str, list[str]], owner: str = "") -> Iterator[None]:
        """Marks the ids in flight for `owner` (a tenant's id; "" on a server without keys)."""
        self.check(groups)
        self.groups.update(groups)
        for key, rids in groups.items():
            self.rids.update(rids)
            self.owners.update(dict.fromkeys([key, *rids], owner))
        try:
            yield
        finally:
            for key, rids in groups.items():
                self.groups.pop(key, None)
                self.rids.difference_update(rids)
                for rid in [key, *rids]:
                    self.owners.pop(rid, None)

    def abort(self, key: str, owner: str | None = None) -> int:
        """Aborts a group (or one sample by its engine id) if `owner` made it (None: whoever did); how many
        engine requests that was. Another tenant's id counts as unknown: it aborts nothing."""
        if owner is not None and self.owners.get(key) != owner:
            return 0
        rids = self.groups.get(key) or ([key] if key in self.rids else [])
        for rid in rids:
            self.engine.abort(rid)
        return len(rids)

    def abort_all(self) -> int:
        for rid in self.rids:
            self.engine.abort(rid)
        return len(self.rids)


@dataclass
class Throughput:
    """Token rates over a sliding window of (time, prompt tokens, generated tokens) counter samples."""

    window_s: float = METRICS_WINDOW_S
    samples: deque[tuple[float, float, float]] = field(default_factory=deque)

    def add(self, t: float, prompt_total: float, generated_total: float) -> None:
        self.samples.append((t, prompt_total, generated_total))
        while len(self.samples) > 2 and self.samples[1][0] <= t - self.window_s:
            self.samples.popleft()

    def rates(self) -> tuple[float, float]:
        """(prompt tokens/s, generated tokens/s); zero until two samples span some time."""
        if len(self.samples) < 2 or self.samples[-1][0] <= self.samples[0][0]:
            return 0.0, 0.0
        (t0, p0, g0), (t1, p1, g1) = self.samples[0], self.samples[-1]
        return (p1 - p0) / (t1 - t0), (g1 - g0) / (t1 - t0)


class ServerState:
    def __init__(self, engine: Engine, model_name: str, limits: ServerLimits | None = None,
                 incremental_streaming_output: bool = False):
        self.engine = engine
        self.model_name = model_name
        # SGLang's server option: a /generate stream event carries only what is new since the last event
        self.incremental_streaming_output = incremental_streaming_output
        self.limits = limits or ServerLimits()
        self.limits.validate()
        self.created = int(time.time())
        self.live = LiveRequests(engine)
        self.programs: set[Cancellable] = set()  # /v1/programs runs in flight (event loop only)
        self.throughput = Throughput()
        self.draining = False
        self.url = "(not listening yet)"  # the base URL, set by launch.make_server / background_server
        self.api_keys = False  # whether requests must bring an API key (the start-up banner says so)
        self.step_log = StepLog()
        # tokenising, chat templates and rendering big responses: CPU work kept off the event loop
        self._cpu = ThreadPoolExecutor(max_workers=min(8, os.cpu_count() or 1), thread_name_prefix="radixlang-cpu")

    async def offload(self, fn: Callable[..., T], *args: object) -> T:
        """Runs `fn(*args)` on the CPU pool, so the event loop keeps answering (/health) meanwhile."""
        return await asyncio.get_running_loop().run_in_executor(self._cpu, functools.partial(fn, *args))

    async def stats(self) -> dict[str, float]:
        """Engine counters (read on the scheduler thread, off the event loop); also a rate sample."""
        stats = await asyncio.to_thread(self.engine.stats)
        self.throughput.add(time.monotonic(), stats["prompt_tokens_total"], stats["generated_tokens_total"])
        return stats

    def ensure_open(self) -> None:
        if self.draining:
            raise APIError(503, "the server is shutting down", kind="unavailable")

    def begin_drain(self, grace_s: float) -> None:
        """Refuses new requests; whatever still runs after `grace_s` seconds is aborted."""
        self.draining = True
        asyncio.get_running_loop().call_later(max(grace_s, 0.0), self._abort_stragglers)

    def _abort_stragglers(self) -> None:
        n = self.live.abort_all()
        for run in list(self.programs):
            run.cancel()
        if n or self.programs:
            logger.warning("shutdown: aborted %d request(s) and %d program(s) still running after the grace period",
                           n, len(self.programs))

    def error_status(self) -> int:
        """Status for a request the engine ended with an error: 503 while shutting down, else 500."""
        return 503 if self.draining else 500

    @contextlib.asynccontextmanager
    async def lifespan(self, app: object) -> AsyncIterator[None]:
        # uvicorn listens only once this startup half returns: the banner comes before /health can answer
        server_log.info(banner(self.engine, self.url, self.api_keys))
        sampler = asyncio.create_task(self._sample_forever())
        started = time.monotonic()
        try:
            yield
        finally:
            sampler.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await sampler
            self._cpu.shutdown(wait=False, cancel_futures=True)
            try:  # the engine outlives the app (whoever made it shuts it down): its counters as of now
                final = await asyncio.to_thread(self.engine.stats)
            except RuntimeError:
                final = self.step_log.latest
            server_log.info(shutdown_line(final, time.monotonic() - started))

    async def _sample_forever(self) -> None:
        while True:
            try:
                stats = await self.stats()
            except RuntimeError:  # engine shut down underneath us: nothing left to sample
                return
            self.step_log.observe(time.monotonic(), stats)
            await asyncio.sleep(METRICS_SAMPLE_INTERVAL_S)


def server_state(request: Request) -> ServerState:
    return request.app.state.server
