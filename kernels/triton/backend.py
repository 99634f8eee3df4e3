"""The Triton attention backend: extend (chains and token trees), split-KV decode, and cascade decode
for groups of requests sharing a radix prefix (prefix read once per group, merged by (o, lse)). A step
planned by `plan` runs the cascade for its grouped decodes; a fixed-shape step (`plan_decode`, what a CUDA
graph captures) with groups runs every sequence through it, an ungrouped one with an empty prefix."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import triton

from ..backend import AttentionBatch, AttentionPlan, DecodeBatch, build_plan, offsets, pack_groups, tree_visibility
from ..kv_quant import KVScales, rotate, write_kv
from ..mla import absorb_output, absorb_query, split_up_proj
from ..reference import extend_latents, plan_extends
from .decode import MAX_SPLITS, decode_attention, decode_parts, merge_states, num_splits
from .extend import BLOCK_N, MASK_CAUSAL, MASK_NONE, MASK_TREE, ExtendSeqs, extend_attention
from .mla import mla_decode

PREFIX_CHUNK = 64  # a split of a cascade's shared prefix reads at least this many keys (fewer splits else)


@dataclass(slots=True)
class DecodeSeqs:
    q_rows: torch.Tensor
    kv_starts: torch.Tensor
    kv_lens: torch.Tensor
    max_kv_len: int


@dataclass(slots=True)
class Cascade:
    """Cascade decode over n positions, each one query row: the prefix pass reads every group's shared
    prefix once for all its members (and, GQA-packed, once for all the query heads of each KV head), in
    `prefix_splits` KV splits (one MASK_NONE sequence per group and split); the suffix pass runs each
    position over the rest of its KV in its own splits; one merge per row folds all those parts together."""

    q_rows: torch.Tensor  # [n] the query row at each position
    split_rows: torch.Tensor  # [prefix_splits * n] q_rows once per split: the prefix pass's queries
    prefix: ExtendSeqs  # split s of group j: queries s * n + [starts[j], starts[j] + sizes[j]), KV chunk s
    suffix: DecodeSeqs  # q_rows over [prefix length, kv_len) of each position's KV (prefix 0: ungrouped)
    prefix_splits: int


def prefix_splits(max_prefix_len: int) -> int:
    """KV splits of the prefix pass: chunks of at least PREFIX_CHUNK keys, at most MAX_SPLITS."""
    return max(1, min(MAX_SPLITS, triton.cdiv(max_prefix_len, PREFIX_CHUNK)))


def build_cascade(q_rows: torch.Tensor, kv_starts: torch.Tensor, kv_lens: torch.Tensor, starts: torch.Tensor,
                  sizes: torch.Tensor, prefix_lens: torch.Tensor, max_group: int, max_prefix_len: int,
                  max_kv_len: int) -> Cascade:
    """Device ops only, so a CUDA graph can hold them: position p is query q_rows[p] over KV entries
    [kv_starts[p], kv_starts[p] + kv_lens[p]) of kv_indices; group j (starts, sizes, prefix_lens as in
    DecodeGroups) shares the first prefix_lens[j] of them. The max_* are host bounds fixed at planning."""
    n, groups, device = q_rows.numel(), starts.numel(), q_rows.device
    splits = prefix_splits(max_prefix_len)
    pos = torch.arange(n, device=device)
    inside = (pos >= starts[:, None]) & (pos < (starts + sizes)[:, None])  # [groups, n]
    own_prefix = (inside * prefix_lens[:, None]).sum(0)  # each position's group's prefix length, 0 if none
    split = torch.arange(splits, device=device)
    chunk = ((prefix_lens + splits - 1) // splits + BLOCK_N - 1) // BLOCK_N * BLOCK_N  # [groups]
    lo = split * chunk[:, None]  # [groups, splits]: where each split's KV chunk starts in the prefix
    entries = groups * splits
    prefix = ExtendSeqs(
        q_starts=(split * n + starts[:, None]).flatten(),
        q_lens=sizes[:, None].expand(groups, splits).flatten(),
        kv_starts=(kv_starts[starts][:, None] + lo).flatten(),  # the first member's KV holds the prefix
        kv_lens=torch.minimum(prefix_lens[:, None] - lo, chunk[:, None]).clamp(min=0).flatten(),
        mask_kind=torch.full((entries,), MASK_NONE, dtype=torch.int64, device=device),
        tree_mask=torch.zeros(1, dtype=torch.int8, device=device),
        tree_starts=torch.zeros(entries, dtype=torch.int64, device=device),
        max_q_len=max_group)
    suffix = DecodeSeqs(q_rows, kv_starts + own_prefix, kv_lens - own_prefix, max_kv_len)
    return Cascade(q_rows, q_rows.repeat(splits), prefix, suffix, splits)


class TritonAttention:
    supports_cascade = True

    def __init__(self, k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor], scales: KVScales | None = None):
        self.k_buffers, self.v_buffers = k_buffers, v_buffers
        self.scales = scales  # a quantized pool's (kernels/kv_quant.py): the kernels dequantize as they load
        self.device = k_buffers[0].device
        # a latent pool (MLA: K and V one buffer) runs forward_latent: extends up-projected in torch, decodes
        # in the latent kernel; no cascade (the latent kernel has no shared-prefix variant)
        self.latent = k_buffers is v_buffers
        self.supports_cascade = not self.latent
        self._latent_extends: list = []  # reference._Extend per multi-token sequence
        self._out_cache_loc: torch.Tensor | None = None
        self._kv_indices: torch.Tensor | None = None  # KV slots that the index tensors below point into
        self._extend: ExtendSeqs | None = None
        self._decode: DecodeSeqs | None = None
        self._cascade: Cascade | None = None

    def _ints(self, values: list[int]) -> torch.Tensor:
        return torch.tensor(values, dtype=torch.int64, device=self.device)

    def plan(self, batch: AttentionBatch) -> AttentionPlan:
        plan = build_plan(batch, self.device)
        q_ptr, kv_ptr = offsets(batch.extend_lens), offsets(batch.kv_lens)
        grouped = {i for members, _ in batch.prefix_groups for i in members}
        ext = [i for i, n in enumerate(batch.extend_lens) if n > 1]
        if self.latent:
            self._latent_extends, ext = plan_extends(batch, plan, q_ptr, kv_ptr), []
        dec = [i for i, n in enumerate(batch.extend_lens) if n == 1 and i not in grouped]
        self._extend = ExtendSeqs.build(
            [q_ptr[i] for i in ext], [batch.extend_lens[i] for i in ext], [kv_ptr[i] for i in ext],
            [batch.kv_lens[i] for i in ext], [MASK_CAUSAL if batch.parents[i] is None else MASK_TREE for i in ext],
            [None if (parents := batch.parents[i]) is None else tree_visibility(parents) for i in ext],
            self.device) if ext else None
        self._decode = DecodeSeqs(self._ints([q_ptr[i] for i in dec]), self._ints([kv_ptr[i] for i in dec]),
                                  self._ints([batch.kv_lens[i] for i in dec]),
                                  max(batch.kv_lens[i] for i in dec)) if dec else None
        self._cascade = self._plan_cascade(batch, q_ptr, kv_ptr) if batch.prefix_groups else None
        self._out_cache_loc, self._kv_indices = plan.out_cache_loc, plan.kv_indices
        return plan

    def plan_decode(self, batch: DecodeBatch) -> None:
        """Reads KV slots straight from req_to_token (sequence i's start is its row's first entry); the
        kernels take each length from the device, so one plan serves any lengths <= max_kv_len. With groups,
        every sequence goes through the cascade (an ungrouped one has an empty prefix)."""
        table, groups = batch.req_to_token, batch.groups
        b = batch.rows.numel()
        kv_starts = batch.rows * table.stride(0)
        self._extend = self._decode = self._cascade = None
        self._latent_extends = []
        if groups is None:
            self._decode = DecodeSeqs(torch.arange(b, device=self.device), kv_starts, batch.kv_lens,
                                      batch.max_kv_len)
        else:
            order = groups.order
            self._cascade = build_cascade(order, kv_starts[order], batch.kv_lens[order], groups.starts, groups.sizes,
                                          groups.prefix_lens, b, batch.max_kv_len, batch.max_kv_len)
        self._out_cache_loc, self._kv_indices = batch.out_cache_loc, table.view(-1)

    def _plan_cascade(self, batch: AttentionBatch, q_ptr: list[int], kv_ptr: list[int]) -> Cascade:
        members, starts, sizes, lens = pack_groups(batch.prefix_groups)
        suffix_lens = [batch.kv_lens[i] - n for group, n in batch.prefix_groups for i in group]
        assert all(batch.extend_lens[i] == 1 for i in members) and min(suffix_lens) > 0, "members are decodes"
        return build_cascade(self._ints([q_ptr[i] for i in members]), self._ints([kv_ptr[i] for i in members]),
                             self._ints([batch.kv_lens[i] for i in members]), self._ints(starts), self._ints(sizes),
                             self._ints(lens), max(sizes), max(lens), max(suffix_lens))

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, scale: float) -> torch.Tensor:
        assert self._out_cache_loc is not None, "plan() runs before forward()"
        kv_indices = self._kv_indices
        assert kv_indices is not None, "plan() sets it with the cache locations"
        k_cache, v_cache = self.k_buffers[layer], self.v_buffers[layer]
        scales = None
        if self.scales is not None:  # codes of H k: queries turn by H too (kernels/kv_quant.rotate)
            scales, q, k = (self.scales.k[layer], self.scales.v[layer]), rotate(q), rotate(k)
        write_kv(k_cache, None if scales is None else scales[0], self._out_cache_loc, k)
        write_kv(v_cache, None if scales is None else scales[1], self._out_cache_loc, v)
        out = torch.empty_like(q)
        if self._extend is not None:
            extend_attention(q, k_cache, v_cache, kv_indices, self._extend, scale, out=out, scales=scales)
        d = self._decode
        if d is not None:
            decode_attention(q, k_cache, v_cache, kv_indices, d.q_rows, d.kv_starts, d.kv_lens, d.max_kv_len,
                             scale, out, d.q_rows, scales=scales)
        if self._cascade is not None:
            self._run_cascade(q, k_cache, v_cache, kv_indices, scale, out, scales)
        return out

    def forward_latent(self, q_nope: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor, layer: int,
                       scale: float, w_kv_b: torch.Tensor) -> torch.Tensor:
        """MLA over the latent pool (kernels/mla.py): decodes absorbed in the Triton latent kernel."""
        assert self._out_cache_loc is not None, "plan() runs before forward_latent()"
        kv_indices = self._kv_indices
        assert kv_indices is not None, "plan() sets it with the cache locations"
        cache = self.k_buffers[layer]
        cache[self._out_cache_loc] = latent.to(cache.dtype)
        w_uk, w_uv = split_up_proj(w_kv_b, q_nope.shape[-1])
        out = q_nope.new_empty(q_nope.shape[0], q_nope.shape[1], w_uv.shape[1])
        d = self._decode
        if d is not None:
            q_abs = absorb_query(q_nope[d.q_rows], q_rope[d.q_rows], w_uk).to(cache.dtype)
            o = mla_decode(q_abs, cache, kv_indices, d.kv_starts, d.kv_lens, w_uk.shape[2], scale)
            out[d.q_rows] = absorb_output(o.to(q_nope.dtype), w_uv)
        extend_latents(out, q_nope, q_rope, cache, self._latent_extends, w_kv_b, scale)
        return out

    def _run_cascade(self, q, k_cache, v_cache, kv_indices, scale: float, out: torch.Tensor,
                     scales: tuple[torch.Tensor, torch.Tensor] | None) -> None:
        c = self._cascade
        assert c is not None, "forward() runs the cascade only when plan() built one"
        s = c.suffix
        n, heads, d = c.q_rows.numel(), q.shape[1], q.shape[2]
        prefix, suffix = c.prefix_splits, num_splits(n, k_cache.shape[1], s.max_kv_len)
        # parts-major, so each prefix split's rows are one contiguous block; a row a split never reaches
        # keeps -inf; the suffix's splits follow, written by its decode straight into this buffer
        o_parts = torch.empty(prefix + suffix, n, heads, d, dtype=torch.float32, device=q.device)
        lse_parts = torch.full((prefix + suffix, n, heads), float("-inf"), dtype=torch.float32, device=q.device)
        extend_attention(q[c.split_rows], k_cache, v_cache, kv_indices, c.prefix, scale,
                         out=o_parts[:prefix].view(prefix * n, heads, d),
                         lse=lse_parts[:prefix].view(prefix * n, heads), scales=scales)
        decode_parts(q, k_cache, v_cache, kv_indices, s.q_rows, s.kv_starts, s.kv_lens, scale,
                     o_parts[prefix:].permute(1, 2, 0, 3), lse_parts[prefix:].permute(1, 2, 0), scales)
        merge_states(o_parts.permute(1, 2, 0, 3), lse_parts.permute(1, 2, 0), out, c.q_rows)
