"""Rank 0's handle on the other tensor-parallel ranks: starts them, sends them each step and image
embeddings, notices when one dies or hangs, and shuts them down."""
from __future__ import annotations

import pickle
import socket
import subprocess
import sys
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Callable, Hashable, TypeVar

import torch

from ..config import EngineConfig
from ..execution.model_runner import StepInputs
from .dp_step import DPStep
from .group import TensorParallel, open_store
from .worker import (
    CALL,
    COMMIT,
    DP_STEP,
    EMBEDDING,
    ERROR,
    LOAD,
    PLACE,
    STEP,
    STOP,
    UPDATE,
    WorkerSpec,
    host_step,
    rank_threads,
    receive,
    send,
)

if TYPE_CHECKING:
    from ..weight_sources import UpdateSource
    from .embedding_cache import EmbeddingMirror

T = TypeVar("T")

STARTUP_POLL_S = 0.05
STOP_GRACE_S = 5.0  # a worker that has not exited this long after STOP is killed


class WorkerFailure(RuntimeError):
    """A tensor-parallel rank died, hung past dist_timeout or failed to start: the model cannot run."""


class TPWorkers:
    """Ranks 1..size-1, each a child process; rank 0 is this process (`tp`)."""

    def __init__(self, cfg: EngineConfig, tp: TensorParallel, pool_size: int, device: torch.device):
        if device.type == "cuda" and torch.cuda.device_count() < tp.size:
            raise ValueError(f"tp_size {tp.size} needs one GPU per rank; {torch.cuda.device_count()} are visible")
        self.tp, self.device, self.timeout = tp, device, cfg.dist_timeout
        self.failure: str | None = None
        # rank 0 (this process) takes its share of the cores too, while the workers run; restored in close
        self._threads = torch.get_num_threads() if device.type == "cpu" else None
        if self._threads is not None:
            torch.set_num_threads(rank_threads(tp.size))
        self._store = open_store(cfg.dist_timeout)
        self._procs: list[subprocess.Popen] = []
        self._conns: list[Connection] = []
        try:
            for rank in range(1, tp.size):
                self._start(WorkerSpec(cfg, rank, tp.size, self._store.port, pool_size))
            self._await_loaded()
            tp.join(self._store, device, cfg.dist_timeout)
        except BaseException:
            self.close()
            raise

    def _start(self, spec: WorkerSpec) -> None:
        """A fresh interpreter (a forked child would inherit this process's threads and torch state)."""
        ours, theirs = socket.socketpair()
        with theirs:
            proc = subprocess.Popen([sys.executable, "-m", "radixlang.runtime.distributed.worker",
                                     str(theirs.fileno())], pass_fds=(theirs.fileno(),))
        self._procs.append(proc)
        self._conns.append(Connection(ours.detach()))
        self._conns[-1].send_bytes(pickle.dumps(spec))

    def _await_loaded(self) -> None:
        """Waits for every worker's model; a worker that exits or reports an error fails the start."""
        pending = set(range(len(self._conns)))
        while pending:
            for i in sorted(pending):
                rank, conn, proc = i + 1, self._conns[i], self._procs[i]
                if not conn.poll(STARTUP_POLL_S):
                    continue
                try:
                    kind, body = receive(conn)
                except EOFError:
                    _wait(proc, STOP_GRACE_S)
                    raise WorkerFailure(f"tensor-parallel rank {rank} exited with code {proc.returncode} "
                                        "while loading the model") from None
                if kind == ERROR:
                    raise WorkerFailure(f"tensor-parallel rank {rank} failed to start: {body}")
                pending.discard(i)

    # ---- messages ------------------------------------------------------------------------------
    def send_step(self, inputs: StepInputs) -> None:
        self._send_all(STEP, host_step(inputs))

    def send_dp_steps(self, steps: list[DPStep]) -> None:
        """Worker r (rank r) gets steps[r - 1]: under DP attention each rank runs its own batch."""
        self._send_each(DP_STEP, steps)

    def publish_embedding(self, key: Hashable, t: torch.Tensor, evicted: list[Hashable]) -> None:
        self._send_all(EMBEDDING, (key, tuple(t.shape), t.dtype, evicted))
        try:
            self.tp.broadcast(t.to(self.device))
        except Exception as e:  # noqa: BLE001 - any failure leaves the ranks out of step
            raise self.fail(e) from e

    def place_experts(self, placements: list) -> None:
        """Each worker applies these EPLB placements (list[eplb.Placement]), one per MoE layer."""
        self._send_all(PLACE, placements)

    def expert_loads(self) -> list[torch.Tensor]:
        """Each worker's [MoE layers, experts] routing counts, in rank order."""
        self._send_all(LOAD)
        return [receive(conn)[1] for conn in self._conns]

    def prepare_update(self, source: UpdateSource) -> list[str | None]:
        """Each worker prepares a weight update on its shard (loads, checks); its error or None, in rank order.
        Nothing changes until `commit_update`."""
        self._send_all(UPDATE, source)
        return [receive(conn)[1] for conn in self._conns]

    def commit_update(self, apply: bool) -> None:
        """Every worker applies its prepared update (or drops it), and has when this returns."""
        self._send_all(COMMIT, apply)
        for conn in self._conns:
            receive(conn)

    def call(self, probe: Callable[[EmbeddingMirror], T]) -> list[T]:
        """`probe(mirror)` run on each worker, its results in rank order. `probe` travels pickled, so it
        is a module-level function (radixlang.testing.workers has the tests' probes)."""
        self._send_all(CALL, probe)
        return [receive(conn)[1] for conn in self._conns]

    def _send_all(self, kind: str, body: object = None) -> None:
        self._send_each(kind, [body] * len(self._conns))

    def _send_each(self, kind: str, bodies: list) -> None:
        """bodies[i] to worker i (rank i + 1)."""
        if self.failure is not None:
            raise WorkerFailure(self.failure)
        if any(proc.poll() is not None for proc in self._procs):
            raise self.fail(None)
        try:
            for conn, body in zip(self._conns, bodies, strict=True):
                send(conn, kind, body)
        except OSError as e:
            raise self.fail(e) from e

    # ---- failure and shutdown ------------------------------------------------------------------
    def fail(self, cause: BaseException | None) -> WorkerFailure:
        """Stops every worker and returns the error that explains why the model cannot run any more."""
        for proc in self._procs:
            _wait(proc, 0.2)  # a rank that crashed mid-collective may take a moment to be reaped
        dead = [f"rank {i + 1} exited with code {p.returncode}" for i, p in enumerate(self._procs)
                if p.returncode is not None]
        if dead:
            what = ", ".join(dead)
        else:
            what = f"a collective failed or waited past dist_timeout={self.timeout}s ({cause})"
        self.failure = f"tensor-parallel worker failure: {what}; the engine stopped"
        self.close()
        return WorkerFailure(self.failure)

    def close(self) -> None:
        """Stops the workers (idempotent): asks each to stop, then kills any that hang."""
        for conn in self._conns:
            try:
                send(conn, STOP)
            except OSError:
                pass
        for proc in self._procs:
            if not _wait(proc, STOP_GRACE_S):
                proc.kill()
                proc.wait()
        for conn in self._conns:
            conn.close()
        self._procs, self._conns = [], []
        self.tp.group = None
        if self._threads is not None:
            torch.set_num_threads(self._threads)
            self._threads = None


def _wait(proc: subprocess.Popen, timeout_s: float) -> bool:
    """Whether `proc` exited within `timeout_s`."""
    try:
        proc.wait(timeout_s)
    except subprocess.TimeoutExpired:
        return False
    return True
