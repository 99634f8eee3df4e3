"""Triton fused MoE: the routed experts of one layer as two grouped GEMMs over (token, choice) rows sorted by
expert, as vLLM's fused_moe lays them out.

`align_by_expert` sorts the rows by expert and pads each expert's run to a multiple of BLOCK_M, so every
row block belongs to one expert. `_grouped_gemm_kernel` runs one (row block, column block) per program:
it gathers its rows of A by index (the token's hidden state, or the row's own activation), multiplies
them by that block's expert's weight tile and, in the down projection, scales each row by its router
weight. SiLU * up runs between the two in torch; the per-token sum of the k rows is an index_add.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from .extend import INTERPRETING, dot_precision

BLOCK_M = 16  # rows per program, all of one expert (tl.dot's smallest M)
BLOCK_N = 64
BLOCK_K = 32


@dataclass(slots=True)
class ExpertRows:
    """(token, choice) rows sorted by expert, each expert's run padded to BLOCK_M."""

    source: torch.Tensor  # [padded] int64: the flat (token * k + choice) index of each row; -1 for padding
    block_expert: torch.Tensor  # [padded / BLOCK_M] int64: the expert of each row block


def align_by_expert(topk_ids: torch.Tensor, num_experts: int) -> ExpertRows:
    flat = topk_ids.flatten()
    order = flat.argsort(stable=True)
    counts = torch.bincount(flat, minlength=num_experts)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    starts = torch.cumsum(padded, 0) - padded
    first_sorted = torch.cumsum(counts, 0) - counts
    rank_in_expert = torch.arange(flat.numel(), device=flat.device) - first_sorted[flat[order]]
    source = torch.full((int(padded.sum()),), -1, dtype=torch.int64, device=flat.device)
    source[starts[flat[order]] + rank_in_expert] = order
    block_expert = torch.repeat_interleave(torch.arange(num_experts, device=flat.device), padded // BLOCK_M)
    return ExpertRows(source, block_expert)


@triton.jit
def _grouped_gemm_kernel(A, B, C, a_rows, row_ok_src, block_expert, scales, N, K, stride_am, stride_be,
                         stride_bn, stride_cm, HAS_SCALE: tl.constexpr, BLOCK_M: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, PRECISION: tl.constexpr,
                         UPCAST: tl.constexpr):
    pid_m = tl.program_id(0)
    pid_n = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_k = tl.arange(0, BLOCK_K)
    src = tl.load(row_ok_src + offs_m)
    m_ok = src >= 0
    rows = tl.load(a_rows + offs_m, mask=m_ok, other=0).to(tl.int64)
    expert = tl.load(block_expert + pid_m).to(tl.int64)
    n_ok = offs_n < N
    acc = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for k0 in range(0, K, BLOCK_K):
        k_ok = k0 + offs_k < K
        a = tl.load(A + rows[:, None] * stride_am + (k0 + offs_k)[None, :], mask=m_ok[:, None] & k_ok[None, :],
                    other=0.0)
        b = tl.load(B + expert * stride_be + offs_n[None, :] * stride_bn + (k0 + offs_k)[:, None],
                    mask=n_ok[None, :] & k_ok[:, None], other=0.0)
        if UPCAST:
            a, b = a.to(tl.float32), b.to(tl.float32)
        acc += tl.dot(a, b, input_precision=PRECISION)
    if HAS_SCALE:
        acc *= tl.load(scales + src, mask=m_ok, other=0.0).to(tl.float32)[:, None]
    out = C + offs_m[:, None] * stride_cm + offs_n[None, :]
    tl.store(out, acc.to(C.dtype.element_ty), mask=m_ok[:, None] & n_ok[None, :])


def grouped_gemm(a: torch.Tensor, a_rows: torch.Tensor, rows: ExpertRows, weight: torch.Tensor,
                 scales: torch.Tensor | None = None) -> torch.Tensor:
    """C[i] = a[a_rows[i]] @ weight[expert of row i].T (times scales[source[i]]) for each padded row i;
    a: [M, K]; weight: [E, N, K] -> C: [padded, N] (padding rows unwritten)."""
    padded, (_, n, k) = rows.source.numel(), weight.shape
    c = torch.empty(padded, n, dtype=a.dtype, device=a.device)
    if padded == 0:
        return c
    grid = (padded // BLOCK_M, triton.cdiv(n, BLOCK_N))
    _grouped_gemm_kernel[grid](
        a, weight, c, a_rows, rows.source, rows.block_expert, scales if scales is not None else a, n, k,
        a.stride(0), weight.stride(0), weight.stride(1), c.stride(0), HAS_SCALE=scales is not None,
        BLOCK_M=BLOCK_M, BLOCK_N=BLOCK_N, BLOCK_K=BLOCK_K, PRECISION=dot_precision(a.dtype),
        UPCAST=INTERPRETING, num_warps=4)
    return c


def fused_moe(x: torch.Tensor, gate_up: torch.Tensor, down: torch.Tensor, topk_ids: torch.Tensor,
              topk_weights: torch.Tensor) -> torch.Tensor:
    """x [T, H]; gate_up [E, 2I, H]; down [E, H, I]; topk_* [T, k] -> sum over k of weight * expert(x)."""
    k = topk_ids.shape[1]
    rows = align_by_expert(topk_ids, gate_up.shape[0])
    valid = rows.source >= 0
    token = torch.where(valid, rows.source // k, 0)
    gate, up = grouped_gemm(x, token, rows, gate_up).chunk(2, dim=-1)
    act = (F.silu(gate.float()) * up.float()).to(x.dtype)
    own = torch.arange(rows.source.numel(), device=x.device)
    out = grouped_gemm(act, own, rows, down, topk_weights.flatten().float())
    return torch.zeros_like(x).index_add_(0, token[valid], out[valid])
