"""Kernel microbenchmark: the exact mode's fp32 linear on radixlang_cpu::dense_mm (one reduction order per output
whatever the row count: kernels/cpu/dense_linear.py) against torch's fp32 matmul (MKL / oneDNN, whose order changes
with the rows), for the default model's layer shapes (in x out): 576 x 1728 (q, k, v), 576 x 3072 (gate + up),
1536 x 576 (down), 576 x 576 (o). Rows 1-16 are decode steps, 64 and 512 prefill chunks.

Each timing loops over enough copies of the layer to leave the L2 caches (32 MB of weights), best of `--reps`
rounds of the two kernels interleaved. With one thread (the default) it is the thread's CPU time, which a machine
shared with other processes does not inflate (its wall time does); with more threads, wall time.

    python benchmark/dense_mm.py [--rows 1 4 16 64 512] [--threads 1] [--reps 5]
"""
from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from radixlang.kernels.cpu import block_kernel

SHAPES = [(576, 1728), (576, 3072), (1536, 576), (576, 576)]


def best(fn: Callable[[], object], reps: int, clock: Callable[[], float]) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = clock()
        fn()
        times.append(clock() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 4, 16, 64, 512])
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--reps", type=int, default=5)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    assert block_kernel.available(wait=True), "the block kernel's library (with dense_mm) did not build"
    clock = time.thread_time if args.threads == 1 else time.perf_counter
    print(f"threads {args.threads}; ms per layer call ({'CPU' if args.threads == 1 else 'wall'} time), best of "
          f"{args.reps}")
    print(f"{'in x out':>12} {'rows':>5} {'dense_mm':>9} {'torch':>9} {'ratio':>6} {'GFLOP/s':>8}")
    op = torch.ops.radixlang_cpu.dense_mm
    for k, n in SHAPES:
        copies = max(1, (32 << 20) // (n * k * 4))
        weights = [torch.randn(n, k) * 0.05 for _ in range(copies)]
        for rows in args.rows:
            x = torch.randn(rows, k)
            ours = theirs = float("inf")
            with torch.inference_mode():
                for _ in range(args.reps):  # interleaved: a busy spell of the machine hits both
                    ours = min(ours, best(lambda: [op(x, w) for w in weights], 1, clock) / copies)
                    theirs = min(theirs, best(lambda: [x @ w.T for w in weights], 1, clock) / copies)
            print(f"{k:>5} x {n:<5} {rows:>5} {ours * 1e3:9.3f} {theirs * 1e3:9.3f} {ours / theirs:6.2f} "
                  f"{2 * rows * n * k / ours / 1e9:8.1f}")


if __name__ == "__main__":
    main()
