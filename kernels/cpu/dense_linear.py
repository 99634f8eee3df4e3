"""fp32 linears on the CPU with one reduction order per output, whatever the row count (`radixlang_cpu::dense_mm`,
dense_mm.cpp, built with the block kernel by block_kernel.py).

torch's fp32 matmul chooses its kernel and blocking from the call's shapes (1 row: a matrix-vector product; a few
rows, many rows: other tilings), so a row's last bits depended on the rows beside it: the exact mode's tokens
changed with the batch, the radix cache (an extend of a few rows against a cold prefill) and the prefill chunking
(issue 43). dense_mm accumulates every output over K in one documented order and tiles over rows and features only,
so a row computes the same bits alone, in a decode batch or in a 2,048-row prefill.

Speed against torch's matmul (benchmark/dense_mm.py, one thread, CPU time, the AMX Xeon VM, 2026-12-05, SmolLM2's
shapes): 1-16 rows 0.54-0.97x its time (the weights are read once, no packing), 64 rows 1.07-1.12x, 512 rows
1.3-1.6x (MKL's packed GEMM is the faster prefill; that is the cost of the invariance).

Whether a model's linears use it is decided once, at load (`use_fixed_order`), so a kernel whose background
build lands later does not change a running engine's numbers mid-request."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from . import block_kernel


def available_for(weight: torch.Tensor) -> bool:
    """Whether `weight`'s linear can run dense_mm: fp32 on the CPU, with the op loaded (the block kernel's library;
    a missing build starts in the background, this process keeps torch's matmul)."""
    return weight.device.type == "cpu" and weight.dtype == torch.float32 and block_kernel.available()


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, fixed_order: bool) -> torch.Tensor:
    """x @ weight.T + bias: on dense_mm where `fixed_order` (chosen by available_for at load), else torch's."""
    if not fixed_order or x.dtype != torch.float32:
        return F.linear(x, weight, bias)
    flat = x if x.dim() == 2 else x.reshape(-1, x.shape[-1])
    out = torch.ops.radixlang_cpu.dense_mm(flat, weight)
    if x.dim() != 2:
        out = out.view(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias
