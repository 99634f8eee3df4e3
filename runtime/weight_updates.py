"""Live weight updates, as RL frameworks drive SGLang's rollout engine: new weights from a checkpoint or from
tensors, pause / continue, and the caller's weight version.

An update runs in three moves. Off the scheduler thread, the new weights are loaded and checked against the
serving model (a mismatch is a ValueError and nothing else happens: the engine goes on serving the old weights).
Then the requests in flight settle: aborted (`abort_all_requests`), or run to their end on the old weights while
new requests wait in the queue (Scheduler.hold_new); under a pause nothing runs, and the admitted requests are
retracted instead (their KV dropped: they recompute their tokens so far on the new weights when generation
continues). Last, on the scheduler thread between two steps, the weights are copied in place
(models/loading/weight_copy.py) and every cache of KV computed by the old weights is flushed: the radix tree,
pins, the host tier and the drafter's cache. No request ever sees KV of two weight versions.

Under tensor parallelism every rank takes the update on its own shard (weight_sources.py): rank 0 prepares its
own off the scheduler thread; then, between two steps, each worker prepares its (a checkpoint's shard, or its
rows of the named tensors, sent whole), and only when every rank has succeeded do they all apply it; a mismatch on
any rank drops it everywhere.
"""
from __future__ import annotations

import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Protocol

import torch

from .config import EngineConfig
from .distributed.group import TensorParallel
from .distributed.workers import TPWorkers
from .models.loading import weight_cache
from .models.loading.loader import missing_model_message
from .scheduler_thread import SchedulerThread
from .scheduling.scheduler import Scheduler
from .weight_sources import UpdateSource, prepare

LOAD_FORMATS = ("auto", "safetensors", "gguf")  # SGLang's load_format values that name what we load
PAUSE_MODES = ("in_place", "abort")  # SGLang's pause_generation modes we take
DRAIN_POLL_S = 0.005  # how often an update looks whether the requests in flight have finished
ABORT_MESSAGE = "aborted: the model's weights are being updated (abort_all_requests)"


class AllRequests(Protocol):
    """What pause asks of the engine's scheduler (one rank's, or DP attention's over every rank)."""

    def abort_all(self, error: str | None = None) -> None: ...

    def stats(self) -> dict[str, float]: ...


@dataclass(frozen=True, slots=True)
class UpdateResult:
    """SGLang's answer to an update: what changed, and the version now served."""

    message: str
    weight_version: str
    aborted: int  # requests aborted for it (abort_all_requests)


class LiveWeights:
    """The weight updates of one engine: its config, scheduler thread, scheduler and model."""

    def __init__(self, cfg: EngineConfig, thread: SchedulerThread, scheduler: AllRequests, model: torch.nn.Module,
                 vision: bool, workers: TPWorkers | None = None):
        self.cfg, self.thread, self.model, self.workers = cfg, thread, model, workers
        self.version = cfg.weight_version
        self._lock = threading.Lock()  # one update at a time
        self._refusal = _refusal(cfg, scheduler, vision)
        self._requests = scheduler  # pause's abort reaches every rank's requests
        self._scheduler = scheduler if isinstance(scheduler, Scheduler) else None  # None: no updates (_refusal)

    # ---- pause -----------------------------------------------------------------------------------
    def pause(self, mode: str = "in_place") -> int:
        """Stops the steps: requests stay where they are (queued or running, their KV kept) until `resume`;
        mode "abort" aborts them all first. Returns how many it aborted."""
        if mode not in PAUSE_MODES:
            raise ValueError(f"mode must be one of {PAUSE_MODES}, got {mode!r}")

        def run() -> int:
            aborted = self._abort_all("aborted: generation paused (pause_generation mode abort)") if mode == "abort" else 0
            self.thread.paused = True
            return aborted

        return self.thread.call(run).result()

    def resume(self) -> None:
        """Steps run again (/continue_generation)."""

        def run() -> None:
            self.thread.paused = False

        self.thread.call(run).result()

    # ---- updates -----------------------------------------------------------------------------------
    def from_disk(self, model_path: str, load_format: str | None = None, abort_all_requests: bool = False,
                  weight_version: str | None = None) -> UpdateResult:
        """The weights of another checkpoint of the same architecture and shapes (an HF folder or a GGUF
        file), loaded as the engine loaded its own: the same dtype and quantization mode."""
        self._check_allowed(weight_version)
        path = _checked_path(model_path, load_format)
        result = self._update(UpdateSource(path=path), abort_all_requests, weight_version)
        self.cfg.model = str(path)  # SGLang's model_path follows the update
        return result

    def from_tensors(self, named_tensors: Iterable[tuple[str, torch.Tensor]], abort_all_requests: bool = False,
                     weight_version: str | None = None) -> UpdateResult:
        """HF-named tensors (SGLang's update_weights_from_tensor), whole (each rank takes its shard); only those
        change."""
        self._check_allowed(weight_version)
        named = list(named_tensors)
        for item in named:
            if not (isinstance(item, tuple) and len(item) == 2 and isinstance(item[0], str)
                    and isinstance(item[1], torch.Tensor)):
                raise TypeError(f"named_tensors must be (name, torch.Tensor) pairs, got {item!r:.80}")
        if self.workers is not None:  # they travel to the workers pickled: on the host
            named = [(name, t.detach().cpu()) for name, t in named]
        return self._update(UpdateSource(named_tensors=named), abort_all_requests, weight_version)

    def _update(self, source: UpdateSource, abort: bool, version: str | None) -> UpdateResult:
        """Rank 0's update prepared here (ValueError: nothing changed), then applied on every rank by _swap."""
        apply, message = prepare(self.model, source, self.cfg, TensorParallel.on(0, self.cfg.tp_size, self.cfg.torch_device()),
                                 self.cfg.torch_device())
        return self._swap(apply, source, abort, version, message)

    def _check_allowed(self, version: str | None) -> None:
        if self._refusal is not None:
            raise ValueError(self._refusal)
        if version is not None and not isinstance(version, str):
            raise TypeError(f"weight_version must be a string, got {version!r}")

    def _swap(self, apply: Callable[[], None], source: UpdateSource, abort: bool, version: str | None,
              message: str) -> UpdateResult:
        """Settles the requests in flight, then applies the weights (the workers' too) and flushes the old KV on
        the scheduler thread."""
        scheduler = self._scheduler
        assert scheduler is not None, "_check_allowed refuses engines without one scheduler"
        with self._lock:
            weight_cache.wait_for_write()  # a cache write still reading the old tensors must end before they change

            def begin() -> int:
                scheduler.hold_new = True
                return self._abort_all(ABORT_MESSAGE) if abort else 0

            def apply_now() -> None:
                self._prepare_workers(source)
                if not scheduler.drained:  # paused with requests admitted: they recompute on the new weights
                    scheduler.retract_all()
                apply()
                if self.workers is not None:
                    self.workers.commit_update(True)
                scheduler.flush()
                if version is not None:
                    self.version = version

            def end() -> None:
                scheduler.hold_new = False

            aborted = self.thread.call(begin).result()
            try:
                while not self.thread.query(lambda: self.thread.paused or scheduler.drained):
                    time.sleep(DRAIN_POLL_S)
                self.thread.call(apply_now).result()
            finally:
                self.thread.call(end).result()
        return UpdateResult(message, self.version, aborted)

    def _prepare_workers(self, source: UpdateSource) -> None:
        """Each worker's shard of the update, prepared (scheduler thread, no step running); ValueError naming the
        first rank's mismatch, the update dropped on every rank."""
        if self.workers is None:
            return
        errors = self.workers.prepare_update(source)
        failed = [(rank, e) for rank, e in enumerate(errors, start=1) if e is not None]
        if failed:
            self.workers.commit_update(False)
            raise ValueError(f"tensor-parallel rank {failed[0][0]}: {failed[0][1]}")

    def _abort_all(self, error: str) -> int:
        """Aborts every request (on the scheduler thread); how many."""
        stats = self._requests.stats()
        self._requests.abort_all(error=error)
        return int(stats["running_requests"] + stats["waiting_requests"])


def _refusal(cfg: EngineConfig, scheduler: AllRequests, vision: bool) -> str | None:
    """Why this engine cannot update its weights live (None: it can)."""
    if not isinstance(scheduler, Scheduler):
        return "live weight updates are not supported with DP attention (enable_dp_attention)"
    if vision:
        return "live weight updates are not supported for vision-language models"
    return None


def _checked_path(model_path: str, load_format: str | None) -> Path:
    """The checkpoint's path, checked against `load_format` (None / auto: what the path is)."""
    if not isinstance(model_path, str) or not model_path:
        raise ValueError("model_path must be a non-empty string")
    fmt = load_format or "auto"
    if fmt not in LOAD_FORMATS:
        raise ValueError(f"load_format must be one of {LOAD_FORMATS}, got {load_format!r}")
    path = Path(model_path)
    if not path.exists():
        raise ValueError(missing_model_message(model_path))
    if fmt == "safetensors" and not path.is_dir():
        raise ValueError(f"load_format 'safetensors' needs an HF folder; {model_path!r} is not a folder")
    if fmt == "gguf" and path.suffix != ".gguf":
        raise ValueError(f"load_format 'gguf' needs a .gguf file; got {model_path!r}")
    return path
