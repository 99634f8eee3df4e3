"""W8A8 linear microbenchmark at SmolLM2-135M's shapes (one layer's qkv, o, gate_up, down) for prefill chunks
of --rows rows: fp32 (`quantization="none"`), the bf16 dense copy (`auto`'s prefill path on CPUs with bf16
units), and w8a8.W8A8Linear split into its parts (activation quantize, int8 matmul, rescale) and whole,
untiled and at each --tiles row tile. Figures are per layer, best of a few rounds, in one thread's CPU
time (time.process_time: a loaded machine steals wall time, not CPU time); ratios are against fp32.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import torch
import torch.nn.functional as F

from radixlang.runtime.models.linear import w8a8
from radixlang.runtime.models.linear.w8a8 import W8A8Linear, quantize_rows_int8

SHAPES = {"qkv": (576, 960), "o": (576, 576), "gate_up": (576, 3072), "down": (1536, 576)}  # (in, out)


def cpu_ms(fn: Callable[[], object], rounds: int = 3, calls: int = 4) -> float:
    fn()
    best = float("inf")
    for _ in range(rounds):
        t0 = time.process_time()
        for _ in range(calls):
            fn()
        best = min(best, (time.process_time() - t0) / calls)
    return best * 1e3


def layer_times(rows: int, tiles: list[int]) -> dict[str, float]:
    totals: dict[str, float] = {}
    g = torch.Generator().manual_seed(0)
    for k, n in SHAPES.values():
        w = torch.randn(n, k, generator=g) * 0.05
        x = torch.randn(rows, k, generator=g) * torch.rand(rows, 1, generator=g) * 3
        layer, w_bf16 = W8A8Linear.from_float(w, None), w.bfloat16()
        codes, x_scale = quantize_rows_int8(x)
        acc = torch._int_mm(codes, layer.qweight.T)
        times = {"fp32": cpu_ms(lambda: F.linear(x, w)), "bf16 dense": cpu_ms(lambda: (x.bfloat16() @ w_bf16.T).float()),
                 "w8a8 quantize": cpu_ms(lambda: quantize_rows_int8(x)),
                 "w8a8 int_mm": cpu_ms(lambda: torch._int_mm(codes, layer.qweight.T)),
                 "w8a8 rescale": cpu_ms(lambda: torch.mul(acc, x_scale).mul_(layer.weight_scale))}
        for tile in tiles:
            w8a8.ROW_TILE = tile
            times[f"w8a8 tile {tile}"] = cpu_ms(lambda: layer(x))
        for name, ms in times.items():
            totals[name] = totals.get(name, 0.0) + ms
    return totals


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="64,256,512,2048", help="prefill chunk rows, comma-separated")
    parser.add_argument("--tiles", default=f"{w8a8.ROW_TILE},1000000", help="row tiles (1000000: untiled)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    tiles = [int(t) for t in args.tiles.split(",")]
    for rows in (int(r) for r in args.rows.split(",")):
        totals = layer_times(rows, tiles)
        print(f"\n{rows} rows: ms per layer (CPU time), and fp32's / this")
        for name, ms in totals.items():
            print(f"  {name:18} {ms:8.2f} ms  {totals['fp32'] / ms:5.2f}x")


if __name__ == "__main__":
    main()
