"""torch.compile of the decode forward on the CPU, as gpt-fast compiles its decode step, without the wait.

Eager decode at batch 1 makes ~185 aten calls per layer (views included) around the matmuls; inductor
fuses the norms, residual adds, casts, RoPE and SiLU * up into a few C++ loops and calls the packed
matmuls and attention as external kernels. Measured on SmolLM2 with `quantization="auto"`, one thread, a
loaded 2-core VM: the model step takes ~0.6x the eager step's CPU time, after ~85-120 s of compiling (wall)
per graph (batch 1, larger batches, batches whose lengths differ).

So the engine serves eagerly from its first request while a background thread compiles those graphs on
a scratch decode batch (its own attention backend over a few scratch KV slots: the live pool and plan are
never touched), then decode-only steps switch to the compiled forward. Steps holding prompt chunks, token
trees or image rows stay eager: their shapes change every step. Inductor's FX graph and kernel caches live
in our cache folder (`inductor/`), so the next start on the machine finds the artefacts; a marker per model
says a compile finished there, which `compile_layers="auto"` reads.
"""
from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import sys
import threading
from pathlib import Path
from typing import Callable, Iterator

import torch

from ...kernels.backend import AttentionBackend, AttentionBatch
from .llama import ForwardContext, LlamaForCausalLM
from .weight_cache import cache_dir

logger = logging.getLogger(__name__)
SCRATCH_CONTEXT = 8  # KV slots per scratch sequence
# the GIL's turn length while a compile runs (Python's default is 5 ms; see short_gil_turns)
COMPILING_SWITCH_INTERVAL_S = 0.0005
# (batch, kv lengths) of the warm-up steps: batch 1, a batch, a batch of unequal lengths (the graphs seen)
WARMUP_STEPS = ((1, (4,)), (2, (4, 4)), (3, (3, 5, 4)))


def inductor_cache_dir() -> Path:
    return cache_dir() / "inductor"


def use_our_inductor_cache() -> None:
    """Points inductor's caches (FX graphs, kernels) at our cache folder, unless the user chose one. Importing
    torch._dynamo sets the variable to inductor's default (a per-user folder under /tmp) itself, so that
    value is taken for no choice: else any process that imported it first (a test, transformers) compiled
    into /tmp, and the next start missed the artefacts and compiled for minutes."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    chosen = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if chosen is None or os.path.abspath(chosen) == os.path.abspath(default_cache_dir()):
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = str(inductor_cache_dir())


def warm_marker(model_key: str) -> Path:
    digest = hashlib.sha256(f"{model_key}\0{torch.__version__}".encode()).hexdigest()[:24]
    return inductor_cache_dir() / f"compiled-{digest}.done"


class BackgroundCompile:
    """Routes a model's decode-only steps to its compiled forward once a background thread has compiled it;
    until then (and for every other step) the eager forward runs."""

    def __init__(self, model: LlamaForCausalLM, make_backend: Callable[[list, list], AttentionBackend],
                 k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], marker: Path | None = None):
        use_our_inductor_cache()
        self.eager = model.forward
        self.compiled: Callable | None = None  # made in the thread: importing the compiler takes seconds
        self.ready = False  # the compiled forward serves decode-only steps
        self.finished = threading.Event()  # compiled, or failed (then `error` says why)
        self.error: BaseException | None = None
        self.marker = marker
        self._scratch = _scratch_backend(make_backend, k_buffers, v_buffers)
        self._vocab = model.config.vocab_size
        model.forward = self.forward  # type: ignore[method-assign]  # every caller of the model gets the dispatch
        self.thread = threading.Thread(target=self._compile, name="radixlang-compile", daemon=True)
        self.thread.start()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        compiled = self.compiled  # set before `ready`
        if self.ready and compiled is not None and embeds is None and getattr(ctx.attn, "decode_only", False):
            return compiled(input_ids, positions, ctx)
        return self.eager(input_ids, positions, ctx, embeds)

    def _compile(self) -> None:
        with short_gil_turns():
            self._compile_and_warm()

    def _compile_and_warm(self) -> None:
        try:
            self.compiled = torch.compile(self.eager, dynamic=True)
            # the engine's steps run under inference_mode (engine_core.py): so do these, or dynamo's guards on
            # the tensors' dispatch keys fail at the first live step, which then recompiles on the scheduler thread
            with torch.inference_mode():
                for batch, kv_lens in WARMUP_STEPS:
                    plan = self._scratch.plan(_scratch_batch(batch, kv_lens))
                    ids = torch.arange(batch, dtype=torch.int64) % self._vocab
                    self.compiled(ids, plan.positions, ForwardContext(self._scratch))
        except Exception as e:  # noqa: BLE001 - a failed compile leaves the engine eager, not broken
            self.error = e
            logger.warning("background compile failed; decode stays eager: %s", e)
            self.finished.set()
            return
        if self.marker is not None:
            self.marker.parent.mkdir(parents=True, exist_ok=True)
            self.marker.touch()
        self.ready = True
        self.finished.set()


class _GilTurns:
    """Shortens the GIL's turns while any compile in the process runs, and restores them after the last."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._running = 0
        self._saved = sys.getswitchinterval()

    @contextlib.contextmanager
    def shortened(self) -> Iterator[None]:
        with self._lock:
            if self._running == 0:
                self._saved = sys.getswitchinterval()
                sys.setswitchinterval(min(self._saved, COMPILING_SWITCH_INTERVAL_S))
            self._running += 1
        try:
            yield
        finally:
            with self._lock:
                self._running -= 1
                if self._running == 0:
                    sys.setswitchinterval(self._saved)


_GIL_TURNS = _GilTurns()


def short_gil_turns() -> contextlib.AbstractContextManager[None]:
    """While a compile runs. Its thread runs Python (dynamo's tracing) for minutes, and every torch op the
    serving thread calls releases the GIL; taking it back then waits out the compile thread's turn, 5 ms by
    default, so an eager step of ~2000 ops ran several times slower (the first request's first token too)."""
    return _GIL_TURNS.shortened()


def _scratch_backend(make_backend: Callable[[list, list], AttentionBackend], k_buffers: list[torch.Tensor],
                     v_buffers: list[torch.Tensor]) -> AttentionBackend:
    """An attention backend of the live one's kind over a few KV slots of the live buffers' layout."""
    slots = SCRATCH_CONTEXT * _scratch_rows() + 1
    def scratch(t: torch.Tensor) -> torch.Tensor:
        return torch.zeros(slots, *t.shape[1:], dtype=t.dtype, device=t.device)
    return make_backend([scratch(k) for k in k_buffers], [scratch(v) for v in v_buffers])


def _scratch_batch(batch: int, kv_lens: tuple[int, ...]) -> AttentionBatch:
    """`batch` decodes, sequence i on scratch row i with KV slots of its own."""
    table = torch.arange(SCRATCH_CONTEXT * _scratch_rows(), dtype=torch.int32).view(-1, SCRATCH_CONTEXT)
    return AttentionBatch(table, list(range(batch)), list(kv_lens), [1] * batch, [n - 1 for n in kv_lens],
                          [None] * batch)


def _scratch_rows() -> int:
    return max(batch for batch, _ in WARMUP_STEPS)
