"""Triton split-KV decode attention (flash-decoding): one query token per sequence over its paged KV.

Stage 1: one program per (sequence, KV head, split); the query heads of that KV head (GQA) are one
block, so each K/V row is read once for the whole group. Each split writes its normalized output and
the natural-log LSE of its scores into a parts buffer. Stage 2 merges the parts with the associative
(o, lse) operator. A sequence's KV may start past its first entry (a cascade's suffix pass: the shared
prefix is done; its splits go straight into the cascade's parts buffer, merged once with the prefix's).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .extend import INTERPRETING, NEG, block_d, dot_precision, load_kv_rows, softmax_update

TARGET_PROGRAMS = 1024  # enough (sequence, head, split) programs to fill a large GPU
MAX_SPLITS = 16


@triton.jit
def _decode_kernel(Q, K, V, KS, VS, O_part, LSE_part, kv_indices, kv_starts, kv_lens, q_rows, sm_scale,
                   stride_qt, stride_qh, stride_kt, stride_kh, stride_st, stride_pn, stride_ph, stride_ps, stride_ln,
                   stride_lh, stride_ls, GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr,
                   BLOCK_H: tl.constexpr, BLOCK_N: tl.constexpr, NUM_SPLITS: tl.constexpr, PRECISION: tl.constexpr,
                   UPCAST: tl.constexpr, QUANT: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    split = tl.program_id(2)
    row = tl.load(q_rows + seq)
    kv_start = tl.load(kv_starts + seq)
    kv_len = tl.load(kv_lens + seq)
    per_split = tl.cdiv(tl.cdiv(kv_len, NUM_SPLITS), BLOCK_N) * BLOCK_N
    lo = split * per_split
    hi = tl.minimum(kv_len, lo + per_split)
    offs_h = tl.arange(0, BLOCK_H)
    offs_d = tl.arange(0, BLOCK_D)
    h_ok = offs_h < GROUP
    d_ok = offs_d < D
    heads = kv_head * GROUP + offs_h
    q = tl.load(Q + row * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                mask=h_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m_i = tl.full([BLOCK_H], NEG, tl.float32)
    l_i = tl.zeros([BLOCK_H], tl.float32)
    acc = tl.zeros([BLOCK_H, BLOCK_D], tl.float32)
    for start_n in range(lo, hi, BLOCK_N):
        offs_n = start_n + tl.arange(0, BLOCK_N)
        col_ok = offs_n < hi
        slots = tl.load(kv_indices + kv_start + offs_n, mask=col_ok, other=0).to(tl.int64)
        kv_off = slots[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :]
        k = load_kv_rows(K, KS, slots, kv_off, kv_head, stride_st, col_ok, d_ok, q.dtype, QUANT)
        s = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * sm_scale
        v = load_kv_rows(V, VS, slots, kv_off, kv_head, stride_st, col_ok, d_ok, q.dtype, QUANT)
        m_i, l_i, acc = softmax_update(m_i, l_i, acc, s, col_ok[None, :], v, PRECISION)
    l_safe = tl.where(l_i > 0, l_i, 1.0)
    o_part = O_part + seq * stride_pn + heads * stride_ph + split * stride_ps
    tl.store(o_part[:, None] + offs_d[None, :], acc / l_safe[:, None], mask=h_ok[:, None] & d_ok[None, :])
    tl.store(LSE_part + seq * stride_ln + heads * stride_lh + split * stride_ls,
             tl.where(l_i > 0, m_i + tl.log(l_safe), float("-inf")), mask=h_ok)


@triton.jit
def _merge_splits_kernel(O_part, LSE_part, O, LSE, out_rows, stride_pn, stride_ph, stride_ps, stride_qn, stride_qh,
                         stride_qs, stride_ot, stride_oh, stride_lt, stride_lh,
                         D: tl.constexpr, BLOCK_D: tl.constexpr, NUM_PARTS: tl.constexpr,
                         BLOCK_S: tl.constexpr, WRITE_LSE: tl.constexpr):
    seq = tl.program_id(0)
    head = tl.program_id(1)
    row = tl.load(out_rows + seq)
    offs_s = tl.arange(0, BLOCK_S)
    offs_d = tl.arange(0, BLOCK_D)
    lse = tl.load(LSE_part + seq * stride_qn + head * stride_qh + offs_s * stride_qs, mask=offs_s < NUM_PARTS,
                  other=float("-inf"))
    seen = lse > float("-inf")
    m = tl.max(lse, 0)
    w = tl.where(seen, tl.exp(lse - m), 0.0)
    # a part that saw no key may hold anything (it was never written): it is not even read
    o = tl.load(O_part + seq * stride_pn + head * stride_ph + offs_s[:, None] * stride_ps + offs_d[None, :],
                mask=seen[:, None] & (offs_d[None, :] < D), other=0.0)
    total = tl.sum(w, 0)
    out = tl.sum(o * w[:, None], 0) / total
    tl.store(O + row * stride_ot + head * stride_oh + offs_d, out.to(O.dtype.element_ty), mask=offs_d < D)
    if WRITE_LSE:
        tl.store(LSE + row * stride_lt + head * stride_lh, m + tl.log(total))


def num_splits(num_seqs: int, kv_heads: int, max_kv_len: int) -> int:
    """Split the KV until the grid fills the GPU, but never into pieces shorter than a block."""
    want = triton.cdiv(TARGET_PROGRAMS, max(1, num_seqs * kv_heads))
    longest = triton.cdiv(max_kv_len, 64)
    return max(1, min(MAX_SPLITS, triton.next_power_of_2(want), triton.next_power_of_2(longest)))


def decode_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_indices: torch.Tensor,
                     q_rows: torch.Tensor, kv_starts: torch.Tensor, kv_lens: torch.Tensor, max_kv_len: int,
                     scale: float, out: torch.Tensor, out_rows: torch.Tensor, lse: torch.Tensor | None = None,
                     scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Sequence i's query q[q_rows[i]] over KV entries [kv_starts[i], kv_starts[i] + kv_lens[i]) of
    kv_indices -> out[out_rows[i]] (and lse[out_rows[i]] when given). `scales`: (K, V) [slots, kv_heads]
    scales of a quantized cache."""
    seqs, heads, d = q_rows.numel(), q.shape[1], q.shape[2]
    splits = num_splits(seqs, k_cache.shape[1], max_kv_len)
    o_part = torch.empty(seqs, heads, splits, d, dtype=torch.float32, device=q.device)
    lse_part = torch.empty(seqs, heads, splits, dtype=torch.float32, device=q.device)
    decode_parts(q, k_cache, v_cache, kv_indices, q_rows, kv_starts, kv_lens, scale, o_part, lse_part, scales)
    merge_states(o_part, lse_part, out, out_rows, lse)


def decode_parts(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_indices: torch.Tensor,
                 q_rows: torch.Tensor, kv_starts: torch.Tensor, kv_lens: torch.Tensor, scale: float,
                 o_parts: torch.Tensor, lse_parts: torch.Tensor,
                 scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> None:
    """Stage 1 alone: sequence i's KV split S ways -> o_parts[i, :, s] [heads, d] float32 (any strides, d
    contiguous) and lse_parts[i, :, s], for `merge_states` (a split that saw no key gets lse -inf)."""
    heads, d = q.shape[1], q.shape[2]
    seqs, kv_heads, splits = q_rows.numel(), k_cache.shape[1], o_parts.shape[2]
    group = heads // kv_heads
    assert o_parts.shape == (seqs, heads, splits, d) and o_parts.stride(3) == 1
    assert lse_parts.shape == (seqs, heads, splits)
    k_scale, v_scale = scales if scales is not None else (k_cache, v_cache)  # unread without QUANT
    _decode_kernel[(seqs, kv_heads, splits)](
        q, k_cache, v_cache, k_scale, v_scale, o_parts, lse_parts, kv_indices, kv_starts, kv_lens, q_rows, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_scale.stride(0), *o_parts.stride()[:3],
        *lse_parts.stride(), GROUP=group, D=d, BLOCK_D=block_d(d), BLOCK_H=max(16, triton.next_power_of_2(group)),
        BLOCK_N=32, NUM_SPLITS=splits, PRECISION=dot_precision(q.dtype), UPCAST=INTERPRETING,
        QUANT=scales is not None)


def merge_states(o_parts: torch.Tensor, lse_parts: torch.Tensor, out: torch.Tensor, out_rows: torch.Tensor,
                 lse: torch.Tensor | None = None) -> None:
    """Merges S partial attention states per (row, head) with the associative (o, lse) operator:
    o_parts [n, heads, S, d] float32 (any strides, d contiguous) and lse_parts [n, heads, S] ->
    out[out_rows[i]] (and lse[out_rows[i]]). A part with lse = -inf (it saw no key) weighs nothing and
    its o is not read; every row needs one part that saw a key."""
    n, heads, parts, d = o_parts.shape
    assert o_parts.stride(3) == 1 and lse_parts.shape == (n, heads, parts)
    lse_strides = (lse.stride(0), lse.stride(1)) if lse is not None else (0, 0)
    _merge_splits_kernel[(n, heads)](
        o_parts, lse_parts, out, lse if lse is not None else o_parts, out_rows, *o_parts.stride()[:3],
        *lse_parts.stride(), out.stride(0), out.stride(1), *lse_strides, D=d, BLOCK_D=triton.next_power_of_2(d),
        NUM_PARTS=parts, BLOCK_S=triton.next_power_of_2(parts), WRITE_LSE=lse is not None)
