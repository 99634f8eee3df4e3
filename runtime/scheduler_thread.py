"""The one thread that changes request state: runs queued commands, then steps, until shut down."""
from __future__ import annotations

import logging
import queue
import threading
import time
from concurrent.futures import Future
from typing import Callable, Protocol, TypeVar

import torch

from .distributed.workers import WorkerFailure
from .openmp_workers import release_openmp_workers

logger = logging.getLogger(__name__)
T = TypeVar("T")
IDLE_POLL_SECONDS = 0.005


class Steppable(Protocol):
    @property
    def has_work(self) -> bool: ...

    def step(self) -> object:
        """One step; truthy when it scheduled anything."""

    def abort_all(self, error: str | None = None) -> None: ...


class SchedulerThread:
    """Owns the background thread; other threads reach the state it owns only through `call`."""

    def __init__(self, core: Steppable, after_step: Callable[[bool], None] | None = None):
        self.core = core
        self.after_step = after_step  # told after each step whether it scheduled anything (the profiler)
        self._inbox: queue.Queue[Callable[[], None] | None] = queue.Queue()
        self.closed = False
        self.stopped: str | None = None  # why the loop stopped on its own (a TP worker failure)
        self.paused = False  # /pause_generation: no step runs, commands still do; written on this thread only
        # whether the loop has requests, and since when it has none: written by the loop, read by any thread
        self.busy = False
        self.idle_since = time.monotonic()
        self._thread = threading.Thread(target=self._loop, name="radixlang-scheduler", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[[], T]) -> Future[T]:
        """Run `fn` on the scheduler thread; the future carries its result or exception."""
        if self.closed:
            raise RuntimeError(self.stopped or "engine is shut down")
        future: Future[T] = Future()

        def run() -> None:
            try:
                future.set_result(fn())
            except BaseException as e:  # noqa: BLE001 - handed to the caller
                future.set_exception(e)

        self._inbox.put(run)
        return future

    def query(self, fn: Callable[[], T]) -> T:
        """Read scheduler state on its thread, or directly once that thread has stopped."""
        if self.closed and not self._thread.is_alive():
            return fn()
        return self.call(fn).result()

    def idle_seconds(self) -> float:
        """Seconds since the loop last had requests (0 while it has some)."""
        return 0.0 if self.busy else time.monotonic() - self.idle_since

    def _note_work(self) -> None:
        busy = self.core.has_work
        if self.busy and not busy:
            self.idle_since = time.monotonic()
        self.busy = busy

    def stop(self) -> None:
        """Aborts what is still in flight and joins the thread."""
        if not self.closed:
            self.closed = True
            self._inbox.put(None)
        self._thread.join()

    def _loop(self) -> None:
        torch.set_grad_enabled(False)
        progressed = True
        while True:
            # block when idle; poll when the last step could schedule nothing, so we never spin
            wait = None if self.paused or not self.core.has_work else 0.0 if progressed else IDLE_POLL_SECONDS
            if wait is None:  # idle: torch work elsewhere in the process gets the cores (openmp_workers.py)
                release_openmp_workers()
            if not self._drain_inbox(wait):
                break
            if self.paused:  # requests stay where they are until a command resumes the steps
                continue
            self._note_work()
            try:
                progressed = bool(self.core.step())
                self._note_work()
                if self.after_step is not None:
                    self.after_step(progressed)
            except WorkerFailure as e:  # a TP rank died or hung: the model cannot run again
                logger.error("%s", e)
                self.stopped, self.closed = str(e), True
                break
            except Exception as e:  # never let a bug strand callers: fail their requests instead
                logger.exception("scheduler step failed")
                self.core.abort_all(error=f"internal error: {e!r}")
        self.core.abort_all(error=self.stopped or "engine shut down")
        while True:  # commands that raced with shutdown still run, so no caller waits forever
            try:
                fn = self._inbox.get_nowait()
            except queue.Empty:
                break
            if fn is not None:
                fn()
                self.core.abort_all(error=self.stopped or "engine shut down")

    def _drain_inbox(self, wait: float | None) -> bool:
        """Runs queued commands, waiting up to `wait` seconds for the first (None: until one comes);
        False once shutdown was requested."""
        try:
            fn = self._inbox.get_nowait() if wait == 0.0 else self._inbox.get(timeout=wait)
        except queue.Empty:
            return True
        while True:
            if fn is None:
                return False
            fn()
            try:
                fn = self._inbox.get_nowait()
            except queue.Empty:
                return True
