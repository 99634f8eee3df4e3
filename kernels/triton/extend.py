"""Triton extend attention: each sequence's new tokens attend over its paged KV (cached prefix + the new
tokens themselves, already written to the cache), causally for a chain or by a custom mask for a token
tree. Also serves a cascade's shared-prefix pass (no mask: every query sees every key).

One program per (sequence, KV head, block of BLOCK_R rows): a row is one (query, query head) pair of that
KV head's GQA group, query-major, so a program covers the whole group for its queries and each K/V block
it loads serves every query head of the group (GROUP times fewer programs and K/V loads than a program
per query head). Online softmax over blocks of BLOCK_N keys gathered through `kv_indices`. Optionally
writes the natural-log LSE of each row, for merging states.
"""
from __future__ import annotations

import os
from dataclasses import dataclass

import torch
import triton
import triton.language as tl

# finite "minus infinity": a fully masked block then adds exactly nothing once a real key is seen; a
# constexpr, because compiled kernels (not the interpreter) may read no other kind of global
NEG = tl.constexpr(-1.0e30)

MASK_CAUSAL, MASK_TREE, MASK_NONE = 0, 1, 2
BLOCK_N = 32  # keys per step of the online softmax
MAX_BLOCK_ROWS = 128  # (query, head) rows per program: 32 queries of a 4-head group, as FlashAttention's tiles


def block_d(d: int) -> int:
    return max(16, triton.next_power_of_2(d))  # tl.dot needs every dimension >= 16


# Triton's interpreter computes bf16 tl.dot wrongly (3.9): there, 16-bit operands go to fp32 first
INTERPRETING = os.environ.get("TRITON_INTERPRET") == "1"


def dot_precision(dtype: torch.dtype) -> str:
    return "ieee" if dtype == torch.float32 or INTERPRETING else "tf32"  # fp32 stays exact


@triton.jit
def softmax_update(m_i, l_i, acc, s, visible, v, PRECISION: tl.constexpr):
    """Folds one block of scores `s` (and its values `v`) into an online softmax's running max, sum and
    weighted values; keys where `visible` is False weigh nothing."""
    s = tl.where(visible, s, NEG)
    m_new = tl.maximum(m_i, tl.max(s, 1))
    alpha = tl.exp(m_i - m_new)
    p = tl.where(visible, tl.exp(s - m_new[:, None]), 0.0)
    l_i = l_i * alpha + tl.sum(p, 1)
    acc = acc * alpha[:, None] + tl.dot(p.to(v.dtype), v, input_precision=PRECISION).to(tl.float32)
    return m_new, l_i, acc


@triton.jit
def load_kv_rows(Cache, Scales, slots, kv_off, kv_head, stride_st, col_ok, d_ok, dtype, QUANT: tl.constexpr):
    """A block of K or V rows gathered through `slots` as `dtype`: a quantized cache's codes (int8 or e4m3) times
    each row's (slot, KV head) scale, in fp32 (kernels/kv_quant.py)."""
    rows = tl.load(Cache + kv_off, mask=col_ok[:, None] & d_ok[None, :], other=0.0)
    if QUANT:
        scale = tl.load(Scales + slots * stride_st + kv_head, mask=col_ok, other=0.0).to(tl.float32)
        rows = rows.to(tl.float32) * scale[:, None]
    return rows.to(dtype)


@triton.jit
def _extend_kernel(Q, K, V, KS, VS, O, LSE, kv_indices, q_starts, q_lens, kv_starts, kv_lens, mask_kind, tree_mask,
                   tree_starts, sm_scale, stride_qt, stride_qh, stride_kt, stride_kh, stride_st, stride_ot, stride_oh,
                   GROUP: tl.constexpr, D: tl.constexpr, BLOCK_D: tl.constexpr, BLOCK_R: tl.constexpr,
                   BLOCK_N: tl.constexpr, WRITE_LSE: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr,
                   QUANT: tl.constexpr):
    seq = tl.program_id(0)
    kv_head = tl.program_id(1)
    block = tl.program_id(2)
    q_start = tl.load(q_starts + seq)
    q_len = tl.load(q_lens + seq)
    if block * BLOCK_R < q_len * GROUP:
        kv_start = tl.load(kv_starts + seq)
        kv_len = tl.load(kv_lens + seq)
        prefix = kv_len - q_len
        kind = tl.load(mask_kind + seq)
        tree_start = tl.load(tree_starts + seq)
        rows = block * BLOCK_R + tl.arange(0, BLOCK_R)
        offs_m = rows // GROUP  # the row's query
        heads = kv_head * GROUP + rows % GROUP  # and its query head
        offs_d = tl.arange(0, BLOCK_D)
        row_ok = offs_m < q_len
        d_ok = offs_d < D
        q = tl.load(Q + (q_start + offs_m)[:, None] * stride_qt + heads[:, None] * stride_qh + offs_d[None, :],
                    mask=row_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            q = q.to(tl.float32)
        m_i = tl.full([BLOCK_R], NEG, tl.float32)
        l_i = tl.zeros([BLOCK_R], tl.float32)
        acc = tl.zeros([BLOCK_R, BLOCK_D], tl.float32)
        # a chain's queries never see keys past their own position: stop at the block's last one
        kv_end = kv_len
        if kind == 0:
            kv_end = tl.minimum(kv_len, prefix + (block * BLOCK_R + BLOCK_R - 1) // GROUP + 1)
        for start_n in range(0, kv_end, BLOCK_N):
            offs_n = start_n + tl.arange(0, BLOCK_N)
            col_ok = offs_n < kv_len
            slots = tl.load(kv_indices + kv_start + offs_n, mask=col_ok, other=0).to(tl.int64)
            kv_off = slots[:, None] * stride_kt + kv_head * stride_kh + offs_d[None, :]
            k = load_kv_rows(K, KS, slots, kv_off, kv_head, stride_st, col_ok, d_ok, q.dtype, QUANT)
            s = tl.dot(q, tl.trans(k), input_precision=PRECISION).to(tl.float32) * sm_scale
            new = offs_n - prefix  # index of the key among the new tokens (negative: the prefix)
            visible = row_ok[:, None] & col_ok[None, :]
            if kind == 0:
                visible = visible & (new[None, :] <= offs_m[:, None])
            elif kind == 1:
                in_tree = (new[None, :] >= 0) & visible
                bit = tl.load(tree_mask + tree_start + offs_m[:, None] * q_len + new[None, :], mask=in_tree, other=0)
                visible = visible & ((new[None, :] < 0) | (bit != 0))
            v = load_kv_rows(V, VS, slots, kv_off, kv_head, stride_st, col_ok, d_ok, q.dtype, QUANT)
            m_i, l_i, acc = softmax_update(m_i, l_i, acc, s, visible, v, PRECISION)
        l_safe = tl.where(l_i > 0, l_i, 1.0)
        out = acc / l_safe[:, None]
        tl.store(O + (q_start + offs_m)[:, None] * stride_ot + heads[:, None] * stride_oh + offs_d[None, :],
                 out.to(O.dtype.element_ty), mask=row_ok[:, None] & d_ok[None, :])
        if WRITE_LSE:
            lse = tl.where(l_i > 0, m_i + tl.log(l_safe), float("-inf"))
            tl.store(LSE + (q_start + offs_m) * (tl.num_programs(1) * GROUP) + heads, lse, mask=row_ok)


def block_rows(max_q_len: int, group: int) -> int:
    """(query, head) rows per program: up to 32 queries of the whole GQA group (16 rows at least: tl.dot)."""
    return max(16, min(MAX_BLOCK_ROWS, triton.next_power_of_2(min(max_q_len, 32) * group)))


def extend_grid(num_seqs: int, max_q_len: int, heads: int, kv_heads: int) -> tuple[int, int, int]:
    """Programs of one `extend_attention` call: (sequence, KV head, block of rows)."""
    group = heads // kv_heads
    return num_seqs, kv_heads, triton.cdiv(max_q_len * group, block_rows(max_q_len, group))


def extend_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, kv_indices: torch.Tensor,
                     seqs: "ExtendSeqs", scale: float, out: torch.Tensor | None = None,
                     lse: torch.Tensor | None = None, scales: tuple[torch.Tensor, torch.Tensor] | None = None
                     ) -> torch.Tensor:
    """q [tokens, heads, d] -> o [tokens, heads, d] (into `out` when given: any float dtype).

    Sequence i's queries are rows [q_starts[i], q_starts[i] + q_lens[i]) of q; its KV is entries
    [kv_starts[i], kv_starts[i] + kv_lens[i]) of kv_indices, the last q_lens[i] of them its new tokens
    (MASK_CAUSAL, MASK_TREE) unless MASK_NONE (every query sees every key). Every length is read on the
    device: the grid depends only on the number of sequences and `max_q_len`, a bound (an empty sequence's
    programs exit at once). With `lse` ([tokens, heads] float32, contiguous) each row's natural-log LSE is
    written there too (-inf for a row that saw no key). Rows outside every sequence are left unwritten.
    `scales`: (K, V) [slots, kv_heads] scales of a quantized cache, whose codes are dequantized as they load."""
    tokens, heads, d = q.shape
    kv_heads = k_cache.shape[1]
    o = torch.empty_like(q) if out is None else out
    assert lse is None or (lse.is_contiguous() and lse.shape == (tokens, heads)), "lse is [tokens, heads]"
    group = heads // kv_heads
    rows = block_rows(seqs.max_q_len, group)
    k_scale, v_scale = scales if scales is not None else (k_cache, v_cache)  # unread without QUANT
    _extend_kernel[extend_grid(seqs.q_starts.numel(), seqs.max_q_len, heads, kv_heads)](
        q, k_cache, v_cache, k_scale, v_scale, o, o if lse is None else lse, kv_indices, seqs.q_starts, seqs.q_lens,
        seqs.kv_starts, seqs.kv_lens, seqs.mask_kind, seqs.tree_mask, seqs.tree_starts, scale,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_scale.stride(0), o.stride(0), o.stride(1),
        GROUP=group, D=d, BLOCK_D=block_d(d), BLOCK_R=rows, BLOCK_N=BLOCK_N, WRITE_LSE=lse is not None,
        PRECISION=dot_precision(q.dtype), UPCAST=INTERPRETING, QUANT=scales is not None,
        num_warps=8 if rows * block_d(d) >= 128 * 128 else 4)
    return o


@dataclass(slots=True)
class ExtendSeqs:
    """Per-sequence device arrays for `extend_attention` (int64), built once per step."""

    q_starts: torch.Tensor
    q_lens: torch.Tensor
    kv_starts: torch.Tensor
    kv_lens: torch.Tensor
    mask_kind: torch.Tensor
    tree_mask: torch.Tensor  # int8: the trees' [n, n] visibility matrices, row-major, concatenated
    tree_starts: torch.Tensor
    max_q_len: int

    @classmethod
    def build(cls, q_starts: list[int], q_lens: list[int], kv_starts: list[int], kv_lens: list[int],
              kinds: list[int], trees: list[torch.Tensor | None], device: torch.device) -> "ExtendSeqs":
        starts, flat, offset = [], [], 0
        for tree in trees:
            starts.append(offset)
            if tree is not None:
                flat.append(tree.flatten().to(torch.int8))
                offset += tree.numel()
        mask = torch.cat(flat) if flat else torch.zeros(1, dtype=torch.int8)

        def t(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.int64, device=device)

        return cls(t(q_starts), t(q_lens), t(kv_starts), t(kv_lens), t(kinds), mask.to(device), t(starts),
                   max(q_lens))
