"""Triton W8A8 int8 linear for GPU (SmoothQuant / RTN W8A8 folders): y = (xq @ wq^T) * x_scale[row] * w_scale[col] + b.

Two kernels, as runtime/models/linear/w8a8.py runs them on the CPU:
- `_quantize_rows_kernel`, per-token dynamic int8: one program per row takes max|x| (pass 1), scale =
  max(max|x|, 127 * tiny) / 127, then codes = round_half_even(x / scale) clamped to +-127 (pass 2). Both
  divisions are IEEE-rounded (div_rn: Triton's plain `/` on fp32 is an approximate division on NVIDIA
  GPUs) and the rounding is done exactly from floor() (no libdevice: the interpreter runs it as numpy),
  so the codes and scales are bit-equal to w8a8.quantize_rows_int8's on the CPU.
- `_w8a8_gemm_kernel`: int8 x int8 tiles on tensor cores (tl.dot, int32 accumulation: exact, as
  |sum| <= K * 128**2 < 2**31 for K < 2**17), then the epilogue in fp32: acc * x_scale[row] * w_scale[col]
  (+ bias), rounded once to the output dtype. Without the epilogue (SCALED=False) it stores the int32
  sums, torch._int_mm's result, which is what the tests compare exactly.
Fusing the quantisation into the GEMM's prologue would need each row's max|x| before its first K step,
so every column block would re-read its rows: two launches are simpler, and the codes are a quarter
(bf16: half) of the activations' bytes.

The weights stay [N, K] int8, K contiguous (the checkpoint's layout): both operands are then K-major,
which Hopper's int8 wgmma requires.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .dequant_gemm import output_tile

# the CPU quantiser's floor on max|x| (w8a8._TINY * 127): an all-zero row gets a normal, nonzero scale
MIN_ABSMAX = tl.constexpr(127 * torch.finfo(torch.float32).tiny)
QUANT_BLOCK = 1024  # columns per step of the row quantiser
BLOCK_K = 128  # int8 columns per GEMM step: 128-byte rows of both operands


def gemm_blocks(rows: int) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): tl.dot's smallest row block (16) for decode steps, 64 x 128 for prefill chunks."""
    return (16, 64) if rows <= 16 else (64, 128)


@triton.jit
def _quantize_rows_kernel(X, Q, SCALE, K, stride_xm, stride_qm, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    absmax = tl.zeros([BLOCK], tl.float32)
    for k0 in range(0, K, BLOCK):
        x = tl.load(X + row * stride_xm + k0 + cols, mask=k0 + cols < K, other=0.0).to(tl.float32)
        absmax = tl.maximum(absmax, tl.abs(x))
    scale = tl.math.div_rn(tl.maximum(tl.max(absmax, 0), MIN_ABSMAX), 127.0)
    tl.store(SCALE + row, scale)
    for k0 in range(0, K, BLOCK):
        ok = k0 + cols < K
        x = tl.load(X + row * stride_xm + k0 + cols, mask=ok, other=0.0).to(tl.float32)
        v = tl.math.div_rn(x, tl.broadcast_to(scale, [BLOCK]))
        low = tl.floor(tl.abs(v))
        frac = tl.abs(v) - low  # exact: below 1 low is 0, from 1 on |v| <= 2 * low (Sterbenz)
        code = low.to(tl.int32)
        code += ((frac > 0.5) | ((frac == 0.5) & ((code & 1) == 1))).to(tl.int32)  # half to even, as torch.round
        code = tl.minimum(tl.maximum(tl.where(v < 0, -code, code), -127), 127)  # a guard: |v| < 127.5 already
        tl.store(Q + row * stride_qm + k0 + cols, code.to(tl.int8), mask=ok)


@triton.jit
def _w8a8_gemm_kernel(A, A_SCALE, W, W_SCALE, BIAS, Y, M, N, K, stride_am, stride_wn, stride_ym,
                      SCALED: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr):
    offs_m, offs_n, m_ok, n_ok = output_tile(M, N, BLOCK_M, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.int32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + offs_k < K
        a = tl.load(A + offs_m[:, None] * stride_am + (k0 + offs_k)[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0)
        w = tl.load(W + offs_n[None, :] * stride_wn + (k0 + offs_k)[:, None], mask=n_ok[None, :] & k_ok[:, None],
                    other=0)  # [BLOCK_K, BLOCK_N]: W^T's tile, read along K
        acc = tl.dot(a, w, acc, out_dtype=tl.int32)
    out = Y + offs_m[:, None] * stride_ym + offs_n[None, :]
    if SCALED:
        a_scale = tl.load(A_SCALE + offs_m, mask=m_ok, other=0.0)
        w_scale = tl.load(W_SCALE + offs_n, mask=n_ok, other=0.0)
        y = acc.to(tl.float32) * a_scale[:, None] * w_scale[None, :]
        if HAS_BIAS:
            y += tl.load(BIAS + offs_n, mask=n_ok, other=0.0).to(tl.float32)[None, :]
        tl.store(out, y.to(Y.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])
    else:
        tl.store(out, acc, mask=m_ok[:, None] & n_ok[None, :])


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-row symmetric int8 of x [M, K] (fp32 / bf16 / fp16): (codes [M, K] int8, scale [M] fp32),
    bit-equal to w8a8.quantize_rows_int8."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    m, k = x.shape
    codes = torch.empty(m, k, dtype=torch.int8, device=x.device)
    scale = torch.empty(m, dtype=torch.float32, device=x.device)
    if m:
        _quantize_rows_kernel[(m,)](x, codes, scale, k, x.stride(0), codes.stride(0),
                                    BLOCK=min(QUANT_BLOCK, triton.next_power_of_2(k)), num_warps=4)
    return codes, scale


def _gemm(a: torch.Tensor, weight: torch.Tensor, y: torch.Tensor, a_scale: torch.Tensor | None = None,
          w_scale: torch.Tensor | None = None, bias: torch.Tensor | None = None) -> torch.Tensor:
    m, k = a.shape
    n = weight.shape[0]
    assert weight.shape[1] == k and a.dtype == weight.dtype == torch.int8 and a.stride(1) == weight.stride(1) == 1
    if m == 0:
        return y
    rows, cols = gemm_blocks(m)
    scaled = a_scale is not None and w_scale is not None
    _w8a8_gemm_kernel[(triton.cdiv(m, rows), triton.cdiv(n, cols))](
        a, a_scale if scaled else a, weight, w_scale if scaled else weight, bias if bias is not None else y, y, m, n, k,
        a.stride(0), weight.stride(0), y.stride(0), SCALED=scaled, HAS_BIAS=bias is not None, BLOCK_M=rows,
        BLOCK_N=cols, BLOCK_K=BLOCK_K, num_warps=4)
    return y


def int8_matmul(a: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """a [M, K] int8 @ weight [N, K] int8 ^T -> [M, N] int32, exact (torch._int_mm(a, weight.T))."""
    return _gemm(a, weight, torch.empty(a.shape[0], weight.shape[0], dtype=torch.int32, device=a.device))


def w8a8_linear(x: torch.Tensor, weight: torch.Tensor, weight_scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [M, K] @ (weight [N, K] int8 * weight_scale [N] fp32)^T (+ bias) -> [M, N] in x's dtype, with x
    quantized per row to int8 first (SmoothQuant's W8A8)."""
    codes, scale = quantize_rows(x)
    y = torch.empty(x.shape[0], weight.shape[0], dtype=x.dtype, device=x.device)
    return _gemm(codes, weight, y, scale, weight_scale.reshape(-1), bias)
