"""Triton dequant-GEMM for GPTQ / AWQ weights on GPU: y = x @ W^T + b with
W[n, k] = scale[g, n] * (code[k, n] - zero[g, n]), g = g_idx[k], read from the packed codes.

Codes are packed 32 / bits per int32 word along K, lowest bits first: GPTQ's own qweight layout [K * bits / 32,
N] (AWQ's interleaved words are repacked to it at load). Each program computes a [BLOCK_M, BLOCK_N] tile of
y: per BLOCK_K columns it loads the words that hold its codes, shifts each code out, takes the scale and
zero of that run's group (one per column, as a run of GROUP_RUN columns lies in one group), dequantises
in fp32, where each (code - zero) * scale is exact, rounds once to the activations' dtype and multiplies on
tensor cores, accumulating in fp32. So the weights cross memory at 4 or 8 bits each (what decode's speed
is), and with fp16 activations W is bit-equal to the format's own fp16 dequantisation (AutoGPTQ's, AutoAWQ's).

Act-order checkpoints (GPTQ desc_act: g_idx not sorted) are sorted by group at load, as for the CPU kernel,
and the caller gathers the input columns in that order (checkpoint_quant.PermutedInput).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .extend import INTERPRETING, dot_precision

GROUP_RUN = 32  # columns per K step, all of one group: every supported group size is a multiple of it
BLOCK_N = 64


def block_m(rows: int) -> int:
    """Rows per program: tl.dot's smallest (16) for decode steps, 64 for prefill chunks."""
    return 16 if rows <= 16 else 64


@triton.jit
def output_tile(M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """This program's rows and columns of a [M, N] output (grid: row blocks, column blocks), and which exist."""
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    return offs_m, offs_n, offs_m < M, offs_n < N


@triton.jit
def _dequant_gemm_kernel(X, QW, S, Z, G_IDX, BIAS, Y, M, N, K, stride_xm, stride_ym, BITS: tl.constexpr,
                         HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    offs_m, offs_n, m_ok, n_ok = output_tile(M, N, BLOCK_M, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    shifts = (offs_k % (32 // BITS)) * BITS
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        a = tl.load(X + offs_m[:, None] * stride_xm + (k0 + offs_k)[None, :], mask=m_ok[:, None], other=0.0)
        words = tl.load(QW + ((k0 + offs_k) // (32 // BITS))[:, None] * N + offs_n[None, :], mask=n_ok[None, :], other=0)
        codes = (words >> shifts[:, None]) & ((1 << BITS) - 1)  # [BLOCK_K, BLOCK_N]
        group = tl.load(G_IDX + k0)
        scale = tl.load(S + group * N + offs_n, mask=n_ok, other=0.0)
        zero = tl.load(Z + group * N + offs_n, mask=n_ok, other=0).to(tl.int32)
        w = (codes - zero[None, :]).to(tl.float32) * scale[None, :]
        if UPCAST:  # the interpreter's dot is numpy's: fp32 on both sides
            a = a.to(tl.float32)
        else:
            w = w.to(a.dtype)
        acc += tl.dot(a, w, input_precision=PRECISION)
    if HAS_BIAS:
        acc += tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
    out = Y + offs_m[:, None] * stride_ym + offs_n[None, :]
    tl.store(out, acc.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def dequant_gemm(x: torch.Tensor, qweight: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
                 g_idx: torch.Tensor, bits: int, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] (fp32 / bf16 / fp16) @ W^T (+ bias) -> [M, N] in x's dtype. qweight [K * bits / 32, N] int32;
    scales [G, N] fp32; zeros [G, N] int16; g_idx [K] int32, constant over each run of GROUP_RUN columns."""
    m, k = x.shape
    n = qweight.shape[1]
    assert k % GROUP_RUN == 0 and qweight.shape[0] * 32 // bits == k, (x.shape, qweight.shape, bits)
    x = x.contiguous()
    y = torch.empty(m, n, dtype=x.dtype, device=x.device)
    if m == 0:
        return y
    rows = block_m(m)
    grid = (triton.cdiv(m, rows), triton.cdiv(n, BLOCK_N))
    _dequant_gemm_kernel[grid](
        x, qweight, scales, zeros, g_idx, bias if bias is not None else scales, y, m, n, k, x.stride(0), y.stride(0),
        BITS=bits, HAS_BIAS=bias is not None, BLOCK_M=rows, BLOCK_N=BLOCK_N, BLOCK_K=GROUP_RUN,
        PRECISION=dot_precision(x.dtype), UPCAST=INTERPRETING, num_warps=4)
    return y
