"""Kernel microbenchmark: one low-bit linear at 1-32 rows on the native block kernel (block_kernel.py) in the
layout the loader packs here (interleaved by 16 features where the build has AVX-512 VNNI) and in the rows layout,
torch's int4pack kernel (quant.Int4Linear's packed path), the bf16 dense copy on its oneDNN-packed weight
(prepacked.py; where the CPU has bf16 units) and an fp32 matmul (`quantization="none"`), for the default model's
layer shapes (in x out): 576 x 3072 (gate + up, Q4_1), 1536 x 576 (down, Q4_1), 576 x 49152 (the tied LM head,
Q8_0). Each kernel runs at every row count (no dense switch). Median wall ms of a loop over enough copies of the
layer to leave the L2 caches (64 MB of fp32 weights; a large L3 may still hold them), per call.

    python benchmark/block_mm.py [--rows 1 2 4 8 16 32] [--threads N]
"""
from __future__ import annotations

import argparse
import statistics
import time

import gguf
import numpy as np
import torch

from radixlang.kernels.cpu import block_kernel, prepacked
from radixlang.kernels.cpu.gguf_blocks import read_blocks
from radixlang.runtime.models.linear import quant

SHAPES = [(576, 3072, gguf.GGMLQuantizationType.Q4_1), (1536, 576, gguf.GGMLQuantizationType.Q4_1),
          (576, 49152, gguf.GGMLQuantizationType.Q8_0)]


def timed(fn, reps: int) -> float:
    fn()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rows", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    ap.add_argument("--threads", type=int, default=torch.get_num_threads())
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    assert block_kernel.available(wait=True), "the block kernel did not build"
    print(f"threads {args.threads}; ms per layer call, median of {args.reps}; block: the layout packed here "
          f"({'interleaved by 16' if block_kernel.interleave() else 'rows'})")
    print(f"{'in x out':>12} {'type':>5} {'rows':>5} {'block':>8} {'rows':>8} {'int4pack':>9} {'bf16':>8} {'fp32':>8} "
          f"{'fp32/block':>10}")
    for k, n, qtype in SHAPES:
        w = np.random.default_rng(0).standard_normal((n, k)).astype(np.float32) * 0.05
        blocks = read_blocks(gguf.quants.quantize(w, qtype), qtype, (n, k))
        copies = max(1, (64 << 20) // (n * k * 4))  # fp32 weights past the caches
        block = [block_kernel.block_operands(blocks) for _ in range(copies)]
        rows_layout = [block_kernel.row_operands(blocks) for _ in range(copies)]
        packed = [quant.Int4Linear(blocks, None) for _ in range(copies)]
        for layer in packed:
            layer.dense_min_rows = 1 << 30  # the packed kernel at every row count
        dense = [blocks.dequantize() for _ in range(copies)]
        bf16 = [(d.to(torch.bfloat16), prepacked.pack(d.to(torch.bfloat16))) for d in dense]
        for rows in args.rows:
            x = torch.randn(rows, k)
            with torch.inference_mode():
                tb = timed(lambda: [torch.ops.radixlang_cpu.block_mm(x, *ops, blocks.bits) for ops in block],
                           args.reps) / copies
                tr = timed(lambda: [torch.ops.radixlang_cpu.block_mm(x, *ops, blocks.bits) for ops in rows_layout],
                           args.reps) / copies
                tp = timed(lambda: [m(x) for m in packed], args.reps) / copies
                th = (timed(lambda: [prepacked.dense_matmul(x, d, p) for d, p in bf16], args.reps) / copies
                      if bf16[0][1] is not None else float("nan"))
                td = timed(lambda: [x @ d.T for d in dense], args.reps) / copies
            print(f"{k:>5} x {n:<5} {qtype.name:>5} {rows:>5} {tb * 1e3:8.3f} {tr * 1e3:8.3f} {tp * 1e3:9.3f} "
                  f"{th * 1e3:8.3f} {td * 1e3:8.3f} {td / tb:10.2f}")

if __name__ == "__main__":
    main()
