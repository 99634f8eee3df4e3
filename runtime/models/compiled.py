"""torch.compile of the decode forward on the CPU, as gpt-fast compiles its decode step, without the wait.

Eager decode at batch 1 makes ~185 aten calls per layer (views included) around the matmuls; inductor
fuses the norms, residual adds, casts, RoPE and SiLU * up into a few C++ loops and calls the packed
matmuls and attention as external kernels. Measured on SmolLM2 with `quantization="auto"`, one thread, a
loaded 2-core VM: the model step takes ~0.6x the eager step's CPU time, after ~85-120 s of compiling (wall)
per graph (batch 1, larger batches, batches whose lengths differ).

So the engine serves eagerly from its first request while a background thread compiles those graphs on
a scratch decode batch (its own attention backend over a few scratch KV slots: the live pool and plan are
never touched), then decode-only steps switch to the compiled forward. Steps holding prompt chunks, token
trees or image rows stay eager: their shapes change every step. The compile starts once the engine is up
and has had no request for COMPILE_AFTER_IDLE_S: it takes a core and the GIL, which made the engine's start
and its first request 2-3x slower (a one-shot `generate` ends before it would start). Inductor's FX graph
and kernel caches live in our cache folder (`inductor/`), so the next start on the machine finds the
artefacts; a marker per model says a compile finished there, which `compile_layers="auto"` reads.

A process may end while a compile runs. A thread still inside the compiler when the interpreter finalizes
is frozen at its next take of the GIL, under torch's C++ frames, and the process aborts ("terminate called
without an active exception", exit 134). So `stop()` (Engine.shutdown, and an exit hook for engines never
shut down) cancels the compile: it raises CompileCancelled in the thread at its next Python line and waits
for the thread to leave.
"""
from __future__ import annotations

import atexit
import contextlib
import ctypes
import hashlib
import logging
import os
import sys
import threading
import time
import types
import weakref
from pathlib import Path
from typing import Callable, Iterator

import torch

from ...cache_dir import cache_dir
from ...kernels.backend import AttentionBackend, AttentionBatch
from ...kernels.kv_quant import KVScales
from .llama import ForwardContext, LlamaForCausalLM
from .moe_llama import moe_blocks

logger = logging.getLogger(__name__)
SCRATCH_CONTEXT = 8  # KV slots per scratch sequence
# the GIL's turn length while a compile runs (Python's default is 5 ms; see short_gil_turns)
COMPILING_SWITCH_INTERVAL_S = 0.0005
# (batch, kv lengths) of the warm-up steps: batch 1, a batch, a batch of unequal lengths (the graphs seen), and
# a second size of that batch: its graph first compiles for batch 3 alone, and the next size recompiled it (for
# seconds, on the scheduler thread) at the first such live step. warmup_steps() adds the model's row switches.
WARMUP_STEPS = ((1, (4,)), (2, (4, 4)), (3, (3, 5, 4)), (4, (6, 3, 5, 4)))
MAX_WARMED_ROWS = 256  # a layer whose dense copy starts beyond this many rows is not warmed there
# the compile starts once the engine has had no request for this long: while it runs, the engine's steps take
# 2-3x as long (it takes a core and the GIL), and the engine's start and first request should not pay for that
COMPILE_AFTER_IDLE_S = 1.0
COMPILE_START_LATEST_S = 60.0  # ... or this long after the engine's start: a busy server compiles all the same
# how long stop() waits for a cancelled compile's thread: it leaves at its next Python line, which a C++ call
# (a kernel's compile, waiting on inductor's workers) can hold back for seconds on a busy machine
STOP_TIMEOUT_S = 30.0
STOP_RAISE_EVERY_S = 0.1
IDLE_POLL_S = 0.05
# inductor's C++ wrapper: the compiled step calls its ~150 kernels and ops from C++ instead of a generated Python
# function. SmolLM2 `auto` (2-core Xeon VM, idle): batch 1 1.17-1.21x faster a step; the first compile on a machine
# takes 871 s instead of 376 (each graph's wrapper and kernels build as one C++ file), every later start 114 s
# instead of 273. `cpp_wrapper_build_separate` compiled cold in 380 s but warm in 298 s, at the same speed
COMPILE_OPTIONS: dict[str, str | int | bool] = {"cpp_wrapper": True}


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
    # the options are part of the key: artefacts compiled under other options are not in the cache's reach
    key = f"{model_key}\0{torch.__version__}\0{sorted(COMPILE_OPTIONS.items())}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return inductor_cache_dir() / f"compiled-{digest}.done"


class CompileCancelled(BaseException):
    """Raised in a compile's thread by `stop()`. Not an Exception, so that no `except Exception` in the
    compiler (or ours, which takes a failed compile for eager) swallows it."""


class BackgroundCompile:
    """Routes a model's decode-only steps to its compiled forward once a background thread has compiled it;
    until then (and for every other step, and for good after a failed or cancelled compile) the eager
    forward runs."""

    def __init__(self, model: LlamaForCausalLM, make_backend: Callable[..., AttentionBackend],
                 k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], marker: Path | None = None,
                 scales: KVScales | None = None):
        self.eager = model.forward
        self.compiled: Callable | None = None  # made in the thread: importing the compiler takes seconds
        self.ready = False  # the compiled forward serves decode-only steps
        self.finished = threading.Event()  # compiled, failed (then `error` says why) or cancelled
        self.error: BaseException | None = None
        self.cancel = threading.Event()  # stop() was called: the compile ends, or never starts
        self.cancelled = False  # the compile ended unfinished because of stop()
        self._raisable = False  # the thread runs the compile: stop() may raise CompileCancelled in it
        self._lock = threading.Lock()  # orders _raisable against stop()'s raise
        self.marker = marker
        self._steps = warmup_steps(model)
        self._scratch_rows = max(batch for batch, _ in self._steps)
        self._scratch = _scratch_backend(make_backend, k_buffers, v_buffers, self._scratch_rows, scales)
        self._vocab = model.config.vocab_size
        self._module_guards_droppable = not moe_blocks(model)
        model.forward = self.forward  # type: ignore[method-assign]  # every caller of the model gets the dispatch
        self.thread = threading.Thread(target=self._compile, name="radixlang-compile", daemon=True)
        self._idle_seconds: Callable[[], float] = lambda: COMPILE_AFTER_IDLE_S
        _LIVE.add(self)

    def start(self, idle_seconds: Callable[[], float]) -> None:
        """Starts the thread, which compiles once `idle_seconds()` (the engine's time without a request) reaches
        COMPILE_AFTER_IDLE_S, or COMPILE_START_LATEST_S from now at the latest."""
        self._idle_seconds = idle_seconds
        self.thread.start()

    def forward(self, input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        compiled = self.compiled  # set before `ready`
        if self.ready and compiled is not None and embeds is None and getattr(ctx.attn, "decode_only", False):
            return compiled(input_ids, positions, ctx)
        return self.eager(input_ids, positions, ctx, embeds)

    @property
    def state(self) -> str:
        """"compiling" (decode is eager meanwhile; also while it waits for an idle engine), "ready" (the compiled
        forward serves decode), or, with decode eager for good, "failed" or "cancelled" (stopped unfinished)."""
        if not self.finished.is_set():
            return "compiling"
        if self.cancelled:
            return "cancelled"
        return "failed" if self.error is not None else "ready"

    def stop(self, timeout: float = STOP_TIMEOUT_S) -> None:
        """Cancels the compile if it still runs, and waits up to `timeout` s for its thread to leave the
        compiler; a finished compile keeps serving. Idempotent."""
        self.cancel.set()
        if self.thread.ident is None:  # never started
            self.cancelled = True
            self.finished.set()
            return
        deadline = time.monotonic() + timeout
        with _lost_cancels_unreported():
            while self.thread.is_alive() and time.monotonic() < deadline:
                with self._lock:
                    if self._raisable:  # again each turn: a raise that lands in a __del__ or weakref callback is lost
                        _raise_in(self.thread, CompileCancelled)
                self.thread.join(min(STOP_RAISE_EVERY_S, max(0.0, deadline - time.monotonic())))
        if self.thread.is_alive():
            logger.warning("the background compile did not stop within %.0f s; exiting now may abort", timeout)

    def _compile(self) -> None:
        try:
            self._wait_for_an_idle_engine()
            started = time.monotonic()
            logger.info("background compile of the decode forward started; decode runs eager meanwhile")
            with short_gil_turns():
                self._compile_and_warm()
            if self.ready:
                logger.info("background compile finished in %.0f s; decode runs compiled", time.monotonic() - started)
        except CompileCancelled:
            self.cancelled = True
            logger.info("background compile cancelled; decode stays eager")
        finally:
            self.finished.set()

    def _wait_for_an_idle_engine(self) -> None:
        latest = time.monotonic() + COMPILE_START_LATEST_S
        while self._idle_seconds() < COMPILE_AFTER_IDLE_S and time.monotonic() < latest:
            if self.cancel.wait(IDLE_POLL_S):
                raise CompileCancelled

    def _compile_and_warm(self) -> None:
        with self._lock:
            if self.cancel.is_set():  # stopped before the thread ran
                raise CompileCancelled
            self._raisable = True
        try:
            self._compile_and_warm_up()
        except Exception as e:  # noqa: BLE001 - a failed compile leaves the engine eager, not broken
            if self.cancel.is_set():  # the cancel, wrapped on its way (as class creation wraps a __set_name__'s)
                raise CompileCancelled from e
            self.error = e
            logger.warning("background compile failed; decode stays eager: %s", e)
            return
        finally:
            with self._lock:
                self._raisable = False
            _take_pending_exception()
        if self.marker is not None:  # no marker for a compile that failed or was cancelled (raised above)
            self.marker.parent.mkdir(parents=True, exist_ok=True)
            self.marker.touch()
        self.ready = True

    def _compile_and_warm_up(self) -> None:
        use_our_inductor_cache()  # here, not at the engine's start: importing inductor takes ~1.7 s
        options: dict[str, str | int | bool | Callable[..., object]] = dict(COMPILE_OPTIONS)
        if self._module_guards_droppable:
            options["guard_filter_fn"] = torch.compiler.skip_guard_on_all_nn_modules_unsafe
        self.compiled = torch.compile(own_code(self.eager), dynamic=True, options=options)
        # the engine's steps run under inference_mode (engine_core.py): so do these, or dynamo's guards on
        # the tensors' dispatch keys fail at the first live step, which then recompiles on the scheduler thread
        with torch.inference_mode():
            for batch, kv_lens in self._steps:
                if self.cancel.is_set():
                    raise CompileCancelled
                plan = self._scratch.plan(_scratch_batch(batch, kv_lens, self._scratch_rows))
                ids = torch.arange(batch, dtype=torch.int64) % self._vocab
                self.compiled(ids, plan.positions, ForwardContext(self._scratch))


def own_code(forward: Callable) -> Callable:
    """`forward` (a bound method) on a copy of its function that has a code object of its own.

    Dynamo keeps a function's compiled graphs, and the guards that pick one, on its code object, which every
    instance of the class shares. Each engine's model gets its own, so its graphs are reached from its forward
    alone, and the guards on the model's modules can be dropped (`guard_filter_fn`). SmolLM2's batch-1 graph has
    4,935 guards, 4,576 of them on the modules' attributes and weights, all checked at every step, with the caches
    cold from the weights' stream; none of that changes once the engine runs (weights, shapes and config are fixed
    at load). What still picks a graph is kept: the inputs' shapes, the attention plan's tensors, global state.
    Not for mixture-of-experts models, whose expert tables EPLB replaces while the engine runs."""
    fn = forward.__func__  # type: ignore[attr-defined]
    own = types.FunctionType(fn.__code__.replace(), fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    own.__kwdefaults__, own.__qualname__ = fn.__kwdefaults__, fn.__qualname__
    return types.MethodType(own, forward.__self__)  # type: ignore[attr-defined]


_LIVE: weakref.WeakSet[BackgroundCompile] = weakref.WeakSet()  # compiles of this process, for the exit hook


@atexit.register
def _stop_live_compiles() -> None:
    """At interpreter exit, before threads are frozen: cancels the compiles of engines never shut down."""
    for job in list(_LIVE):
        job.stop()


def _raise_in(thread: threading.Thread, exc: type[BaseException]) -> None:
    """Raises `exc` in `thread` when it next runs Python code (CPython's PyThreadState_SetAsyncExc)."""
    assert thread.ident is not None
    ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(thread.ident), ctypes.py_object(exc))


@contextlib.contextmanager
def _lost_cancels_unreported() -> Iterator[None]:
    """Python reports an exception that a __del__ or weakref callback could not raise ("Exception ignored
    in ..."): a lost CompileCancelled, which stop() raises again, is no news for the user."""
    report = sys.unraisablehook

    def hook(unraisable: sys.UnraisableHookArgs) -> None:
        if not isinstance(unraisable.exc_value, CompileCancelled):
            report(unraisable)

    sys.unraisablehook = hook
    try:
        yield
    finally:
        sys.unraisablehook = report


def _take_pending_exception() -> None:
    """A call of a Python function: a CompileCancelled raised just before `_raisable` went False is
    delivered here, at the latest, where _compile catches it, not after the thread's last handler."""


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


def warmup_steps(model: torch.nn.Module) -> tuple[tuple[int, tuple[int, ...]], ...]:
    """WARMUP_STEPS, then for each row count from which some packed linear of `model` runs its dense copy
    (`dense_min_rows`: a branch the compiled graph guards on, so batches from there on take graphs of their own)
    a batch of that many rows of equal lengths and one of unequal lengths: else the first live batch that large
    recompiled, for ~20 s, on the scheduler thread (SmolLM2 `auto`: 7 rows)."""
    switches = sorted({rows for m in model.modules()
                       if 1 < (rows := getattr(m, "dense_min_rows", 0)) <= MAX_WARMED_ROWS})
    steps = list(WARMUP_STEPS)
    for rows in switches:
        steps += [(rows, (4,) * rows), (rows, tuple(3 + i % 3 for i in range(rows)))]
    return tuple(steps)


def _scratch_backend(make_backend: Callable[..., AttentionBackend], k_buffers: list[torch.Tensor],
                     v_buffers: list[torch.Tensor], rows: int, scales: KVScales | None = None) -> AttentionBackend:
    """An attention backend of the live one's kind over a few KV slots per row of the live buffers' layout
    (and, for a quantized pool, scales of the live ones' layout)."""
    slots = SCRATCH_CONTEXT * rows + 1
    def scratch(t: torch.Tensor) -> torch.Tensor:
        return torch.zeros(slots, *t.shape[1:], dtype=t.dtype, device=t.device)
    scratch_scales = None if scales is None else KVScales([scratch(s) for s in scales.k], [scratch(s) for s in scales.v])
    return make_backend([scratch(k) for k in k_buffers], [scratch(v) for v in v_buffers], scratch_scales)


def _scratch_batch(batch: int, kv_lens: tuple[int, ...], rows: int) -> AttentionBatch:
    """`batch` decodes, sequence i on scratch row i (of `rows`) with KV slots of its own."""
    table = torch.arange(SCRATCH_CONTEXT * rows, dtype=torch.int32).view(-1, SCRATCH_CONTEXT)
    return AttentionBatch(table, list(range(batch)), list(kv_lens), [1] * batch, [n - 1 for n in kv_lens],
                          [None] * batch)

