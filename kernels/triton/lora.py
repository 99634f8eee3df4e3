"""Triton kernel of the gathered LoRA delta (kernels/lora.py plans it): y[t] += B[s] (A[s] x[t]).

One program per (tile of TILE rows of one adapter slot, block of BLOCK_N output columns): it gathers its rows
of x, shrinks them to the rank (h = x A^T, fp32 accumulation over K in BLOCK_K steps), expands the block of
columns (h B^T) and adds it to y in place, at the rows the plan marks real. Each row's sums run in one order
fixed by K, R and the block sizes (chosen by the shapes, never the batch), so the delta is batch-invariant as
the torch path is. The shrink is recomputed by each column block: R is a few dozen, K a hidden size, so it is
a small share of the work and saves a launch and a round trip of h through memory.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ..lora import LoraPlan
from .extend import INTERPRETING, dot_precision

BLOCK_K = 64
BLOCK_N = 64


@triton.jit
def _lora_delta_kernel(X, A, BT, Y, ROWS, VALID, SLOTS, K, N, R,
                       stride_x, stride_as, stride_ar, stride_bs, stride_br, stride_y,
                       TILE_M: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_R: tl.constexpr, BLOCK_N: tl.constexpr,
                       PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    tile = tl.program_id(0)
    col_block = tl.program_id(1)
    offs_t = tl.arange(0, TILE_M)
    rows = tl.load(ROWS + tile * TILE_M + offs_t)
    valid = tl.load(VALID + tile * TILE_M + offs_t)
    slot = tl.load(SLOTS + tile)
    offs_r = tl.arange(0, BLOCK_R)
    h = tl.zeros([TILE_M, BLOCK_R], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        x = tl.load(X + rows[:, None] * stride_x + offs_k[None, :], mask=offs_k[None, :] < K, other=0.0)
        a = tl.load(A + slot * stride_as + offs_r[None, :] * stride_ar + offs_k[:, None],
                    mask=(offs_k[:, None] < K) & (offs_r[None, :] < R), other=0.0)  # [BLOCK_K, BLOCK_R]
        x = x.to(a.dtype)
        if UPCAST:  # the interpreter's 16-bit dot is wrong (extend.py): fp32 on both sides there
            x, a = x.to(tl.float32), a.to(tl.float32)
        h += tl.dot(x, a, input_precision=PRECISION)
    offs_n = col_block * BLOCK_N + tl.arange(0, BLOCK_N)
    b = tl.load(BT + slot * stride_bs + offs_r[:, None] * stride_br + offs_n[None, :],
                mask=(offs_n[None, :] < N) & (offs_r[:, None] < R), other=0.0)  # [BLOCK_R, BLOCK_N]
    hb = h.to(b.dtype)  # the rank activations rounded as the torch path's bmm rounds them
    if UPCAST:
        hb, b = hb.to(tl.float32), b.to(tl.float32)
    delta = tl.dot(hb, b, input_precision=PRECISION)
    out = Y + rows[:, None] * stride_y + offs_n[None, :]
    keep = (valid[:, None] != 0) & (offs_n[None, :] < N)
    y = tl.load(out, mask=keep, other=0.0)
    # the delta rounded to y's dtype, then added in fp32 and rounded once: torch's 16-bit add
    tl.store(out, (y.to(tl.float32) + delta.to(y.dtype).to(tl.float32)).to(y.dtype), mask=keep)


def lora_delta_triton(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, plan: LoraPlan) -> torch.Tensor:
    """kernels/lora.py's lora_delta_torch, in place on y (returned). x [T, K], a [slots, R, K], bt [slots, R, N]."""
    assert x.stride(1) == 1 and y.stride(1) == 1 and a.stride(2) == 1 and bt.stride(2) == 1, "rows must be contiguous"
    k, n, r = x.shape[1], y.shape[1], a.shape[1]
    grid = (plan.num_tiles, triton.cdiv(n, BLOCK_N))
    _lora_delta_kernel[grid](
        x, a, bt, y, plan.rows, plan.valid, plan.tile_slots, k, n, r,
        x.stride(0), a.stride(0), a.stride(1), bt.stride(0), bt.stride(1), y.stride(0),
        TILE_M=plan.tile, BLOCK_K=BLOCK_K, BLOCK_R=max(16, triton.next_power_of_2(r)), BLOCK_N=BLOCK_N,
        PRECISION=dot_precision(a.dtype), UPCAST=INTERPRETING)
    return y
