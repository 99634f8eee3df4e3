"""Which CPU matmul path a low-bit linear takes: the dense copy's dtype from the CPU's features, the row
crossover from a one-time measurement on this machine, cached on disk, for torch's int4pack kernel, the path
where the block kernel is not built (below). quant.BlockLinear has no crossover: it runs the block kernel at
every row count, so that a row's result does not depend on the rows beside it (docs/determinism.md).

The packed int4 / int8 kernels read the fewest bytes, so they win while a step has few rows; their cost
grows with the rows (they unpack every weight once per few rows), so from `dense_min_rows` rows on a layer
runs a dense matmul over a copy of its weights. That copy is bf16 where the CPU has bf16 units (AVX512_BF16
or AMX: a bf16 matmul is then the fastest), and fp32 elsewhere: on an AVX2-only CPU a bf16 matmul converts
every element and ran 2-3x slower than fp32, so the dense path there is exactly what `quantization="none"`
computes, on the file's dequantized weights, and the default is never slower than `none` on large steps.

Where the two cost the same depends on the CPU, its caches and the layer's form, not only on its feature
flags: on the AMX Xeon a bf16 matmul matched int4pack at about 12 rows; on an AVX2 EPYC (Zen, 2 cores)
int4pack beat the fp32 matmul up to 12 rows and more, and a Q8_0 layer (two int4 halves, the input repeated)
up to 8 rows, where the old rule "rows x halves >= 8" had switched it to the fp32 copy from 4 rows at half the
speed. So the first low-bit model on a machine times both paths on weights too large for its caches, for
each form (1 and 2 halves), at 1-32 rows, and `crossover` picks the rows from which the dense matmul is no
slower (where the two paths' fitted lines cross); the result is kept in the cache folder (`cpu_paths.json`), keyed by the CPU's features, torch's
version and the thread count, so later starts read it (~1 s once per machine). RADIXLANG_CPU_PATHS=bf16|fp32
forces the dense dtype and the features' default crossovers, without a measurement (benchmarks; tests of the
other kind of machine).
"""
from __future__ import annotations

import contextlib
import functools
import json
import logging
import math
import os
import time
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from ....kernels.cpu import prepacked

logger = logging.getLogger(__name__)

BF16_DENSE_MIN_ROWS = 12  # the features' defaults, used where the crossover is not measured
FP32_DENSE_MIN_ROWS = 8
MEASURED_ROWS = (1, 2, 4, 6, 8, 12, 16, 24, 32)  # the rows the one-time measurement times
HALVES = (1, 2)  # a layer's int4 halves: 1 for 4-bit weights, 2 for Q8_0 (see quant.Int4Linear)
CACHE_FILE = "cpu_paths.json"


@dataclass(frozen=True, slots=True)
class CpuPaths:
    capability: str  # torch's kernel dispatch level: "AVX512", "AVX2", ...
    flags: tuple[str, ...]  # the features that decide: avx2, avx512, avx512_bf16, amx_tile
    dense_dtype: torch.dtype  # the dense copy's dtype for steps of dense_min_rows rows and more
    dense_min_rows: int  # the features' default crossover (`dense_min_rows()` gives the measured one)
    forced: bool = False  # RADIXLANG_CPU_PATHS chose the dtype: the default crossovers, no measurement

    def describe(self) -> str:
        dense = "bf16" if self.dense_dtype == torch.bfloat16 else "fp32"
        return f"cpu {self.capability} [{' '.join(self.flags) or 'none'}]: packed int4/int8, then {dense} dense"

    def cache_key(self) -> str:
        dense = "bf16" if self.dense_dtype == torch.bfloat16 else "fp32"
        # "prepacked": the dense side is timed on its oneDNN-packed copy (prepacked.py); older entries timed a plain matmul
        return (f"{self.capability}|{','.join(self.flags)}|{dense}-prepacked|torch{torch.__version__}|"
                f"{torch.get_num_threads()}t")


@functools.lru_cache(maxsize=1)
def detect() -> CpuPaths:
    probes = {"avx2": torch.cpu._is_avx2_supported, "avx512": torch.cpu._is_avx512_supported,
              "avx512_bf16": torch.cpu._is_avx512_bf16_supported, "amx_tile": torch.cpu._is_amx_tile_supported}
    flags = tuple(name for name, probe in probes.items() if probe())
    capability = torch.backends.cpu.get_cpu_capability()
    bf16 = prepacked.bf16_units()  # the same test decides whether the bf16 copies are packed
    forced = os.environ.get("RADIXLANG_CPU_PATHS")
    if forced not in (None, "", "bf16", "fp32"):
        raise ValueError(f"RADIXLANG_CPU_PATHS must be 'bf16' or 'fp32', got {forced!r}")
    if forced:
        bf16 = forced == "bf16"
    if bf16:
        return CpuPaths(capability, flags, torch.bfloat16, BF16_DENSE_MIN_ROWS, bool(forced))
    return CpuPaths(capability, flags, torch.float32, FP32_DENSE_MIN_ROWS, bool(forced))


def crossover(times: dict[int, tuple[float, float]], default: int) -> int:
    """The fewest rows from which the dense matmul is no slower than the packed kernel; `times`: rows ->
    (packed seconds, dense seconds). Each path's time is fitted as a line in the rows (least squares over
    the counts of 2 rows and more: one row is a matrix-vector product, a path of its own) and the lines'
    crossing rounded up, so one disturbed count (a shared machine) moves the choice a little, not to the
    next count measured: on the AVX2 VM the first count where dense was faster went 12, 16, 24 between runs.
    Dense no slower at every count: 1; the packed kernel's line never crossed: twice the largest count.
    No measurements: `default`."""
    if not times:
        return default
    rows = sorted(times)
    if all(times[r][1] <= times[r][0] for r in rows):
        return 1
    fit = [r for r in rows if r >= 2]
    if len(fit) < 2:
        return 2 * rows[-1] if times[rows[-1]][1] > times[rows[-1]][0] else rows[-1]
    (p0, p1), (d0, d1) = (_line(fit, [times[r][i] for r in fit]) for i in (0, 1))
    if p1 <= d1:  # the packed kernel grows no faster with the rows: it does not lose later
        return 2 * rows[-1] if p0 < d0 else 2
    return min(max(2, math.ceil((d0 - p0) / (p1 - d1))), 2 * rows[-1])


def _line(xs: list[int], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line through (xs, ys)."""
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)
    return my - slope * mx, slope


def dense_min_rows(halves: int = 1) -> int:
    """Rows from which a packed linear of `halves` int4 halves (1, or 2 for Q8_0) runs its dense copy
    instead: measured once on this machine and cached (see the module's docstring)."""
    return _crossovers()[min(max(halves, 1), max(HALVES))]


@functools.lru_cache(maxsize=1)
def _crossovers() -> dict[int, int]:
    paths = detect()
    if paths.forced:
        return {h: paths.dense_min_rows for h in HALVES}
    return _measured_crossovers(paths.cache_key(), HALVES, lambda h: measure(paths.dense_dtype, h),
                                paths.dense_min_rows, "packed")


def _measured_crossovers(key: str, forms: tuple[int, ...],
                         measure_form: Callable[[int], dict[int, tuple[float, float]]], default: int,
                         what: str) -> dict[int, int]:
    """form -> the row crossover saved under `key` in the cache folder's CACHE_FILE, or measured now (each form
    timed by `measure_form`) and saved there."""
    from ....cache_dir import cache_dir

    path = cache_dir() / CACHE_FILE
    try:
        saved = json.loads(path.read_text())
    except (OSError, ValueError):
        saved = {}
    entry = saved.get(key) if isinstance(saved, dict) else None
    if isinstance(entry, dict) and all(isinstance(entry.get(str(f)), int) for f in forms):
        return {f: entry[str(f)] for f in forms}
    t0 = time.perf_counter()
    times = {f: measure_form(f) for f in forms}
    chosen = {f: crossover(times[f], default) for f in forms}
    logger.info("measured the %s / dense crossover on this CPU in %.2f s: %s (%s)", what, time.perf_counter() - t0,
                chosen, key)
    saved = saved if isinstance(saved, dict) else {}
    saved[key] = {str(f): chosen[f] for f in forms} | {
        "times_ms": {str(f): {str(r): [round(t * 1e3, 3) for t in pd] for r, pd in times[f].items()} for f in forms}}
    _save(path, saved)
    return chosen


def _best_thread_times(rows: tuple[int, ...], rounds: int,
                       runs: Callable[[int], tuple[Callable[[], object], Callable[[], object]]]
                       ) -> dict[int, tuple[float, float]]:
    """rows -> (low-bit, dense) seconds of one thread's CPU time, best of `rounds`, the two paths interleaved;
    `runs(rows)` builds the two calls for one row count."""
    best: dict[int, list[float]] = {r: [float("inf"), float("inf")] for r in rows}
    with one_thread():
        for _ in range(rounds):
            for r in rows:
                for i, run in enumerate(runs(r)):
                    t0 = time.thread_time()
                    run()
                    best[r][i] = min(best[r][i], time.thread_time() - t0)
    return {r: (p, d) for r, (p, d) in best.items()}


@contextlib.contextmanager
def one_thread() -> Iterator[None]:
    """torch on one thread inside, its thread count restored after. For work of many small or memory-bound ops
    (converting weights, GPTQ's per-column updates) and for timing one thread: on a busy 2-core machine each
    multi-threaded op waits for a thread that is not scheduled (the default model's tensors took 10.8 s to
    convert on 2 threads at load 4, 0.4-1.1 s on one; SmolLM2's gate/up GPTQ 20 s against 1.1 s)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(threads)


def _save(path, saved: dict) -> None:
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(saved, indent=1))
        tmp.replace(path)
    except OSError as e:  # a read-only cache folder: measure again next start
        logger.warning("could not save the CPU path measurement to %s: %s", path, e)


def measure(dense_dtype: torch.dtype, halves: int, rows: tuple[int, ...] = MEASURED_ROWS, copies: int = 6,
            out_features: int = 2048, in_features: int = 1024, rounds: int = 3) -> dict[int, tuple[float, float]]:
    """rows -> (packed, dense) seconds of one thread's CPU time for a matmul over `copies` layers of
    [out_features, in_features] weights (fp32 copies 48 MB in all: past the caches, as a model's layers
    are), best of `rounds`, the two paths interleaved. One thread's CPU time, not wall time: other processes
    on a shared machine disturb it far less, and the ratio is what decides."""
    from ....kernels.cpu.gguf_blocks import GROUP

    k = in_features * halves
    # the values do not change the time (no denormals): constant weights build fast; random bytes are
    # valid int4pack tiles (two 4-bit codes each)
    layers = [(torch.randint(0, 256, (out_features, k // 2), dtype=torch.uint8),
               torch.full((k // GROUP, out_features, 2), 0.01, dtype=torch.bfloat16),
               torch.full((out_features, in_features), 0.01, dtype=dense_dtype)) for _ in range(copies)]

    packed = [prepacked.pack(d) for _, _, d in layers]

    def runs(r: int) -> tuple[Callable[[], object], Callable[[], object]]:
        x = torch.full((r, in_features), 0.5)
        xp = x.to(torch.bfloat16).repeat(1, halves)
        return (lambda: [torch.ops.aten._weight_int4pack_mm_for_cpu(xp, p, GROUP, sz) for p, sz, _ in layers],
                lambda: [prepacked.dense_matmul(x, d, pd) for (_, _, d), pd in zip(layers, packed)])

    return _best_thread_times(rows, rounds, runs)
