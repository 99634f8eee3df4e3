"""Which CPU matmul path a low-bit linear takes, chosen from the CPU's features at start.

The packed int4 / int8 kernels read the fewest bytes, so they win while a step has few rows; their cost
grows with the rows (they unpack every weight once per few rows), so from `dense_min_rows` rows on a layer
runs a dense matmul over a copy of its weights. That copy is bf16 where the CPU has bf16 units (AVX512_BF16
or AMX: a bf16 matmul is then the fastest), and fp32 elsewhere: on an AVX2-only CPU a bf16 matmul converts
every element and ran 2-3x slower than fp32, so the dense path there is exactly what `quantization="none"`
computes, on the file's dequantized weights, and the default is never slower than `none` on large steps.

Crossovers (SmolLM2-135M's shapes, 1 thread, a shared 2-core VM, same-run ratios): on the AMX Xeon a bf16
matmul matched int4pack at about 12 rows; with torch's AVX2 kernels (ATEN_CPU_CAPABILITY=avx2,
ONEDNN_MAX_CPU_ISA=AVX2 on that machine) int4pack matched the fp32 matmul at about 8-16 rows per layer.
RADIXLANG_CPU_PATHS=bf16|fp32 forces one (benchmarks; tests of the other kind of machine).
"""
from __future__ import annotations

import functools
import os
from dataclasses import dataclass

import torch

BF16_DENSE_MIN_ROWS = 12
FP32_DENSE_MIN_ROWS = 8


@dataclass(frozen=True, slots=True)
class CpuPaths:
    capability: str  # torch's kernel dispatch level: "AVX512", "AVX2", ...
    flags: tuple[str, ...]  # the features that decide: avx2, avx512, avx512_bf16, amx_tile
    dense_dtype: torch.dtype  # the dense copy's dtype for steps of dense_min_rows rows and more
    dense_min_rows: int

    def describe(self) -> str:
        dense = "bf16" if self.dense_dtype == torch.bfloat16 else "fp32"
        return (f"cpu {self.capability} [{' '.join(self.flags) or 'none'}]: packed int4/int8 below "
                f"{self.dense_min_rows} rows, {dense} dense from there")


@functools.lru_cache(maxsize=1)
def detect() -> CpuPaths:
    probes = {"avx2": torch.cpu._is_avx2_supported, "avx512": torch.cpu._is_avx512_supported,
              "avx512_bf16": torch.cpu._is_avx512_bf16_supported, "amx_tile": torch.cpu._is_amx_tile_supported}
    flags = tuple(name for name, probe in probes.items() if probe())
    capability = torch.backends.cpu.get_cpu_capability()
    # torch's AVX512 kernels and oneDNN's bf16 paths run only at the AVX512 dispatch level
    bf16 = capability.startswith("AVX512") and ("avx512_bf16" in flags or "amx_tile" in flags)
    forced = os.environ.get("RADIXLANG_CPU_PATHS")
    if forced not in (None, "", "bf16", "fp32"):
        raise ValueError(f"RADIXLANG_CPU_PATHS must be 'bf16' or 'fp32', got {forced!r}")
    if forced:
        bf16 = forced == "bf16"
    if bf16:
        return CpuPaths(capability, flags, torch.bfloat16, BF16_DENSE_MIN_ROWS)
    return CpuPaths(capability, flags, torch.float32, FP32_DENSE_MIN_ROWS)
