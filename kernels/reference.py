"""Torch reference attention over the token-granular paged KV: runs anywhere, and is the test oracle."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from .backend import AttentionBatch, AttentionPlan, DecodeBatch, build_plan, offsets, tree_visibility
from .cpu import block_kernel
from .kv_quant import KVScales, read_kv, rotate, write_kv
from .mla import absorb_output, absorb_query, latent_decode, latent_extend, split_up_proj


@dataclass(slots=True)
class _Decodes:
    """Single-token sequences, padded into one batched call."""

    rows: torch.Tensor  # [b] query rows
    slots: torch.Tensor  # [b, max_len] KV slots (0 where padded)
    mask: torch.Tensor | None  # [b, 1, 1, max_len] bool: True where a key is real; None: no padding
    every_row: bool  # the step is these decodes alone, rows 0..b-1 in order: no scatter into the output

    def gather(self, cache: torch.Tensor, dtype: torch.dtype, scales: torch.Tensor | None = None) -> torch.Tensor:
        """[b, kv_heads, max_len, d]: one flat index_select (advanced indexing costs several times more),
        dequantized where `scales` is given."""
        return read_kv(cache, scales, self.slots, dtype).transpose(1, 2)


@dataclass(slots=True)
class _Rows:
    """Every query row of a step with its own visible keys: row r attends over slots[offset[r]:offset[r] + length[r]]
    (radixlang_cpu::attention_rows, one fixed order per row: see `rows_op`)."""

    slots: torch.Tensor  # int64 KV slots, each sequence's in position order
    offset: torch.Tensor  # [n] int64
    length: torch.Tensor  # [n] int64


def rows_op() -> Callable[..., torch.Tensor] | None:
    """The batch-invariant CPU attention (radixlang_cpu::attention_rows, built with the block kernel) where it is
    loaded, else None (torch's SDPA then: a row's last bits depend on the call's shapes). Each query row attends over
    exactly its visible keys in one order, so a row computes the same bits in a decode, a prefill, an extend over a
    cached prefix, beside any other rows and in any chunk (issue 43); SDPA tiles queries and keys by the call's
    shapes and pads a decode batch to its longest sequence."""
    try:
        return torch.ops.radixlang_cpu.attention_rows
    except (AttributeError, RuntimeError):
        return None


@dataclass(slots=True)
class _Extend:
    """One multi-token sequence: query rows [start, end) over `slots` with a [n, total] visibility mask."""

    start: int
    end: int
    slots: torch.Tensor
    mask: torch.Tensor


class TorchAttention:
    """Decodes are padded into one batched call; each extend (prefill chunk or token tree) runs on its own.
    Everything but the per-layer gather and SDPA is computed once per step, in `plan`."""

    supports_cascade = False

    def __init__(self, k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], scales: KVScales | None = None):
        self.k_buffers, self.v_buffers = k_buffers, v_buffers
        self.scales = scales  # a quantized pool's (kernels/kv_quant.py): codes in the buffers, dequantized on read
        self._out_cache_loc: torch.Tensor | None = None
        self._decodes: _Decodes | None = None
        self._extends: list[_Extend] = []
        self._rows: _Rows | None = None
        # decided once: a kernel whose build lands later (block_kernel's background build) must not switch a
        # running engine's numbers mid-request
        k = k_buffers[0] if k_buffers else None
        self._use_rows = (k is not None and k.device.type == "cpu" and (k.dtype == torch.float32 or scales is not None)
                          and k.dim() == 3 and block_kernel.available() and rows_op() is not None)

    def _invariant(self) -> bool:
        """Whether steps run radixlang_cpu::attention_rows: fp32 or quantized caches on the CPU, with the op
        loaded."""
        return self._use_rows

    @property
    def decode_only(self) -> bool:
        """Whether the planned step is decodes alone, one query per sequence: a shape that stays put from
        step to step (the CPU's compiled decode forward runs only such steps)."""
        return self._decodes is not None and self._decodes.every_row

    def plan(self, batch: AttentionBatch) -> AttentionPlan:
        device = self.k_buffers[0].device
        plan = build_plan(batch, device)
        q_ptr, kv_ptr = offsets(batch.extend_lens), offsets(batch.kv_lens)  # host copies: no device sync
        decode = [i for i, n in enumerate(batch.extend_lens) if n == 1]
        self._decodes = self._plan_decodes(plan, decode, q_ptr, kv_ptr, batch.kv_lens) if decode else None
        self._extends = plan_extends(batch, plan, q_ptr, kv_ptr)
        self._out_cache_loc = plan.out_cache_loc
        self._rows = plan_rows(batch, plan, q_ptr, kv_ptr) if self._invariant() else None
        return plan

    def plan_decode(self, batch: DecodeBatch) -> None:
        cols = torch.arange(batch.max_kv_len, device=batch.rows.device)
        valid = cols[None, :] < batch.kv_lens[:, None]
        slots = torch.where(valid, batch.req_to_token[batch.rows, :batch.max_kv_len], 0).long()
        rows = torch.arange(batch.rows.numel(), device=batch.rows.device)
        self._decodes = _Decodes(rows, slots, valid[:, None, None, :], every_row=True)
        self._extends = []
        self._out_cache_loc = batch.out_cache_loc
        self._rows = None
        if self._invariant():
            self._rows = _Rows(slots.reshape(-1), rows * batch.max_kv_len, batch.kv_lens.long())

    @staticmethod
    def _plan_decodes(plan: AttentionPlan, seqs: list[int], q_ptr: list[int], kv_ptr: list[int],
                      kv_lens: list[int]) -> _Decodes:
        device = plan.kv_indices.device
        lens = torch.tensor([kv_lens[i] for i in seqs], device=device)
        starts = torch.tensor([kv_ptr[i] for i in seqs], device=device)
        cols = torch.arange(int(lens.max()), device=device)
        valid = cols[None, :] < lens[:, None]
        index = torch.where(valid, starts[:, None] + cols[None, :], torch.zeros_like(valid, dtype=torch.int64))
        slots = torch.where(valid, plan.kv_indices[index], torch.zeros_like(index))
        rows = torch.tensor([q_ptr[i] for i in seqs], device=device)
        padded = min(kv_lens[i] for i in seqs) < max(kv_lens[i] for i in seqs)  # SDPA is faster unmasked
        return _Decodes(rows, slots, valid[:, None, None, :] if padded else None, every_row=len(seqs) == len(kv_lens))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, scale: float) -> torch.Tensor:
        assert self._out_cache_loc is not None, "plan() runs before forward()"
        k_cache, v_cache = self.k_buffers[layer], self.v_buffers[layer]
        k_scale, v_scale = None, None
        if self.scales is not None:  # codes of H k: queries turn by H too (kernels/kv_quant.rotate)
            k_scale, v_scale, q, k = self.scales.k[layer], self.scales.v[layer], rotate(q), rotate(k)
        write_kv(k_cache, k_scale, self._out_cache_loc, k)
        write_kv(v_cache, v_scale, self._out_cache_loc, v)
        if self._rows is not None and q.dtype == torch.float32:
            op = rows_op()
            assert op is not None
            r = self._rows
            return op(q, k_cache, v_cache, r.slots, r.offset, r.length, scale, k_scale, v_scale)
        d = self._decodes
        if d is not None and d.every_row:
            return self._decode(q, k_cache, v_cache, d, scale, k_scale, v_scale)
        out = torch.empty_like(q)
        if d is not None:
            out[d.rows] = self._decode(q[d.rows], k_cache, v_cache, d, scale, k_scale, v_scale)
        for e in self._extends:
            keys = read_kv(k_cache, k_scale, e.slots, q.dtype).transpose(0, 1).unsqueeze(0)  # [1, kv_heads, L, d]
            values = read_kv(v_cache, v_scale, e.slots, q.dtype).transpose(0, 1).unsqueeze(0)
            qh = q[e.start:e.end].transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
            o = F.scaled_dot_product_attention(qh, keys, values, attn_mask=e.mask, scale=scale, enable_gqa=True)
            out[e.start:e.end] = o[0].transpose(0, 1)
        return out

    def forward_latent(self, q_nope: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor, layer: int,
                       scale: float, w_kv_b: torch.Tensor) -> torch.Tensor:
        """MLA over a latent pool (kernels/mla.py): decodes absorbed, extends up-projected."""
        assert self._out_cache_loc is not None, "plan() runs before forward_latent()"
        cache = self.k_buffers[layer]
        cache.index_copy_(0, self._out_cache_loc, latent.to(cache.dtype))
        w_uk, w_uv = split_up_proj(w_kv_b, q_nope.shape[-1])
        out = q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], w_uv.shape[1])
        d = self._decodes
        if d is not None:
            q_abs = absorb_query(q_nope[d.rows], q_rope[d.rows], w_uk)
            mask = None if d.mask is None else d.mask[:, 0, 0]
            o = latent_decode(q_abs, d.gather(cache, q_abs.dtype)[:, 0], mask, w_uk.shape[2], scale)
            out[d.rows] = absorb_output(o, w_uv)
        extend_latents(out, q_nope, q_rope, cache, self._extends, w_kv_b, scale)
        return out

    @staticmethod
    def _decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, d: _Decodes, scale: float,
                k_scale: torch.Tensor | None, v_scale: torch.Tensor | None) -> torch.Tensor:
        """q: [b, heads, d], one query per sequence -> [b, heads, d]."""
        keys, values = d.gather(k_cache, q.dtype, k_scale), d.gather(v_cache, q.dtype, v_scale)
        o = F.scaled_dot_product_attention(q.unsqueeze(2), keys, values, attn_mask=d.mask, scale=scale,
                                           enable_gqa=True)
        return o.squeeze(2)


def plan_rows(batch: AttentionBatch, plan: AttentionPlan, q_ptr: list[int], kv_ptr: list[int]) -> _Rows:
    """Each query row's visible keys for attention_rows. A chain's row r sees its sequence's slots up to itself (a
    prefix of the sequence's run in kv_indices); a token tree's row sees the cached prefix, then its ancestors and
    itself in position order (a list of its own, after the runs), so a chain written as parents equals the chain."""
    ext = torch.tensor(batch.extend_lens)
    seq = torch.repeat_interleave(torch.arange(len(ext)), ext)
    first = torch.tensor(q_ptr[:-1])[seq]  # each row's sequence's first new row
    prefix = (torch.tensor(batch.kv_lens) - ext)[seq]
    length = prefix + torch.arange(int(ext.sum())) - first + 1
    offset = torch.tensor(kv_ptr[:-1])[seq]
    slots = [plan.kv_indices]
    end = plan.kv_indices.numel()
    for i, parents in enumerate(batch.parents):
        if parents is None:
            continue
        run = plan.kv_indices[kv_ptr[i]:kv_ptr[i + 1]]
        cached = batch.kv_lens[i] - batch.extend_lens[i]
        for j, seen in enumerate(tree_visibility(parents)):
            visible = torch.cat([run[:cached], run[cached:][seen]])
            slots.append(visible)
            offset[q_ptr[i] + j], length[q_ptr[i] + j] = end, visible.numel()
            end += visible.numel()
    return _Rows(torch.cat(slots) if len(slots) > 1 else plan.kv_indices, offset, length)


def plan_extends(batch: AttentionBatch, plan: AttentionPlan, q_ptr: list[int], kv_ptr: list[int]) -> list[_Extend]:
    """Each multi-token sequence's query rows, KV slots and visibility mask."""
    device = plan.kv_indices.device
    return [_Extend(q_ptr[i], q_ptr[i + 1], plan.kv_indices[kv_ptr[i]:kv_ptr[i + 1]],
                    _extend_mask(batch.kv_lens[i], n, batch.parents[i]).to(device))
            for i, n in enumerate(batch.extend_lens) if n > 1]


def extend_latents(out: torch.Tensor, q_nope: torch.Tensor, q_rope: torch.Tensor, cache: torch.Tensor,
                   extends: list[_Extend], w_kv_b: torch.Tensor, scale: float) -> None:
    """Each extend's MLA output into `out`, from its latent rows up-projected to per-head K and V."""
    for e in extends:
        rows = cache.index_select(0, e.slots)[:, 0].to(q_nope.dtype)
        out[e.start:e.end] = latent_extend(q_nope[e.start:e.end], q_rope[e.start:e.end], rows, e.mask, w_kv_b,
                                           scale)


def _extend_mask(total: int, n: int, parents: list[int] | None) -> torch.Tensor:
    """[n, total] bool: every new token sees the cached prefix, then itself and what precedes it in
    its chain (a linear chunk) or its ancestors (a token tree)."""
    prefix = total - n
    mask = torch.ones(n, total, dtype=torch.bool)
    new = torch.ones(n, n, dtype=torch.bool).tril() if parents is None else tree_visibility(parents)
    mask[:, prefix:] = new
    return mask
