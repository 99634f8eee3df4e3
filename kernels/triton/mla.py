"""Triton MLA decode over the latent KV (absorbed form): one query token per sequence, every query head
attending over the same cached rows [c_kv (R) | k_rope (r)], as FlashMLA does.

One program per (sequence, block of BLOCK_H query heads): each latent row is loaded once for the whole
block and used twice, as the key (its R + r dims against q's absorbed and rope parts, two tl.dots) and as
the value (its first R dims). The R and r parts are separate tiles, so 512 + 64 pads nothing (a generic
kernel would pad the 576-wide row to 1024). Output: the weighted sum of latent rows, [B, H, R], which the
model multiplies by W_UV per head.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .extend import INTERPRETING, NEG, block_d, dot_precision, softmax_update

BLOCK_N = 32  # latent rows per step of the online softmax
BLOCK_H = 16  # query heads per program (tl.dot's smallest M)


@triton.jit
def _mla_decode_kernel(Q, KV, O, kv_indices, kv_starts, kv_lens, sm_scale, stride_qb, stride_qh, stride_kt,
                       stride_ob, stride_oh, HEADS: tl.constexpr, R: tl.constexpr, ROPE: tl.constexpr,
                       BLOCK_R: tl.constexpr, BLOCK_ROPE: tl.constexpr, BLOCK_H: tl.constexpr,
                       BLOCK_N: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    seq = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    h_ok = heads < HEADS
    offs_r = tl.arange(0, BLOCK_R)
    offs_p = tl.arange(0, BLOCK_ROPE)
    r_ok, p_ok = offs_r < R, offs_p < ROPE
    q_row = Q + seq * stride_qb + heads[:, None] * stride_qh
    q_lat = tl.load(q_row + offs_r[None, :], mask=h_ok[:, None] & r_ok[None, :], other=0.0)
    q_pe = tl.load(q_row + R + offs_p[None, :], mask=h_ok[:, None] & p_ok[None, :], other=0.0)
    if UPCAST:
        q_lat, q_pe = q_lat.to(tl.float32), q_pe.to(tl.float32)
    kv_start = tl.load(kv_starts + seq)
    kv_len = tl.load(kv_lens + seq)
    m_i = tl.full([BLOCK_H], NEG, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_R], tl.float32)
    for start_n in range(0, kv_len, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < kv_len
        slots = tl.load(kv_indices + kv_start + offs_n, mask=col_ok, other=0).to(tl.int64)
        row = KV + slots[:, None] * stride_kt
        c_kv = tl.load(row + offs_r[None, :], mask=col_ok[:, None] & r_ok[None, :], other=0.0).to(q_lat.dtype)
        k_pe = tl.load(row + R + offs_p[None, :], mask=col_ok[:, None] & p_ok[None, :], other=0.0).to(q_pe.dtype)
        s = tl.dot(q_lat, tl.trans(c_kv), input_precision=PRECISION).to(tl.float32)
        s += tl.dot(q_pe, tl.trans(k_pe), input_precision=PRECISION).to(tl.float32)
        m_i, l_i, acc = softmax_update(m_i, l_i, acc, s * sm_scale, col_ok[None, :], c_kv, PRECISION)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    out = O + seq * stride_ob + heads[:, None] * stride_oh + offs_r[None, :]
    tl.store(out, acc / l_safe[:, None], mask=h_ok[:, None] & r_ok[None, :])


def mla_decode(q: torch.Tensor, kv_cache: torch.Tensor, kv_indices: torch.Tensor, kv_starts: torch.Tensor,
               kv_lens: torch.Tensor, kv_lora_rank: int, scale: float) -> torch.Tensor:
    """q [B, H, R + r] (absorbed); kv_cache [slots, 1, R + r]; sequence b's latent rows are
    kv_indices[kv_starts[b]:kv_starts[b] + kv_lens[b]] -> [B, H, R] (q's dtype)."""
    batch, heads, width = q.shape
    rope = width - kv_lora_rank
    out = torch.empty(batch, heads, kv_lora_rank, dtype=q.dtype, device=q.device)
    kv = kv_cache.view(kv_cache.shape[0], -1)
    grid = (batch, triton.cdiv(heads, BLOCK_H))
    _mla_decode_kernel[grid](
        q, kv, out, kv_indices, kv_starts, kv_lens, scale,
        q.stride(0), q.stride(1), kv.stride(0), out.stride(0), out.stride(1),
        HEADS=heads, R=kv_lora_rank, ROPE=rope, BLOCK_R=block_d(kv_lora_rank), BLOCK_ROPE=block_d(rope),
        BLOCK_H=BLOCK_H, BLOCK_N=BLOCK_N, PRECISION=dot_precision(q.dtype), UPCAST=INTERPRETING,
        num_warps=4)
    return out
