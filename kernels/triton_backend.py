"""The Triton attention backend: extend (chains and token trees), split-KV decode, and cascade decode
for groups of requests sharing a radix prefix (prefix read once per group, merged by (o, lse))."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from .backend import AttentionBatch, AttentionPlan, DecodeBatch, build_plan, offsets, tree_visibility
from .triton_decode import decode_attention, merge_states
from .triton_extend import MASK_CAUSAL, MASK_NONE, MASK_TREE, ExtendSeqs, extend_attention


@dataclass(slots=True)
class DecodeSeqs:
    q_rows: torch.Tensor
    kv_starts: torch.Tensor
    kv_lens: torch.Tensor
    max_kv_len: int


@dataclass(slots=True)
class Cascade:
    """All groups at once: the members' queries gathered group by group."""

    member_rows: torch.Tensor  # [m] rows of q, group-contiguous
    prefix: ExtendSeqs  # one MASK_NONE "sequence" per group over its shared prefix
    suffix: DecodeSeqs  # each member over the rest of its KV (q_rows index the gathered queries)


class TritonAttention:
    supports_cascade = True

    def __init__(self, k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor]):
        self.k_buffers, self.v_buffers = k_buffers, v_buffers
        self.device = k_buffers[0].device
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
        dec = [i for i, n in enumerate(batch.extend_lens) if n == 1 and i not in grouped]
        self._extend = ExtendSeqs.build(
            [q_ptr[i] for i in ext], [batch.extend_lens[i] for i in ext], [kv_ptr[i] for i in ext],
            [batch.kv_lens[i] for i in ext], [MASK_CAUSAL if batch.parents[i] is None else MASK_TREE for i in ext],
            [None if batch.parents[i] is None else tree_visibility(batch.parents[i]) for i in ext],
            self.device) if ext else None
        self._decode = DecodeSeqs(self._ints([q_ptr[i] for i in dec]), self._ints([kv_ptr[i] for i in dec]),
                                  self._ints([batch.kv_lens[i] for i in dec]),
                                  max(batch.kv_lens[i] for i in dec)) if dec else None
        self._cascade = self._plan_cascade(batch, q_ptr, kv_ptr) if batch.prefix_groups else None
        self._out_cache_loc, self._kv_indices = plan.out_cache_loc, plan.kv_indices
        return plan

    def plan_decode(self, batch: DecodeBatch) -> None:
        """Reads KV slots straight from req_to_token (sequence i's start is its row's first entry); the
        kernel takes each length from kv_lens on the device, so one plan serves any lengths <= max_kv_len."""
        table = batch.req_to_token
        b = batch.rows.numel()
        self._decode = DecodeSeqs(torch.arange(b, device=self.device), batch.rows * table.stride(0),
                                  batch.kv_lens, batch.max_kv_len)
        self._extend = self._cascade = None
        self._out_cache_loc, self._kv_indices = batch.out_cache_loc, table.view(-1)

    def _plan_cascade(self, batch: AttentionBatch, q_ptr: list[int], kv_ptr: list[int]) -> Cascade:
        rows, starts, sizes, prefix_starts, prefix_lens, suffix_starts, suffix_lens = [], [], [], [], [], [], []
        for members, length in batch.prefix_groups:
            starts.append(len(rows))
            sizes.append(len(members))
            prefix_starts.append(kv_ptr[members[0]])
            prefix_lens.append(length)
            for i in members:
                assert batch.extend_lens[i] == 1 and batch.kv_lens[i] > length, "cascade members are decodes"
                rows.append(q_ptr[i])
                suffix_starts.append(kv_ptr[i] + length)
                suffix_lens.append(batch.kv_lens[i] - length)
        groups = len(sizes)
        prefix = ExtendSeqs.build(starts, sizes, prefix_starts, prefix_lens, [MASK_NONE] * groups,
                                  [None] * groups, self.device)
        suffix = DecodeSeqs(self._ints(list(range(len(rows)))), self._ints(suffix_starts),
                            self._ints(suffix_lens), max(suffix_lens))
        return Cascade(self._ints(rows), prefix, suffix)

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, scale: float) -> torch.Tensor:
        assert self._out_cache_loc is not None, "plan() runs before forward()"
        k_cache, v_cache = self.k_buffers[layer], self.v_buffers[layer]
        k_cache[self._out_cache_loc] = k.to(k_cache.dtype)
        v_cache[self._out_cache_loc] = v.to(v_cache.dtype)
        kv_indices = self._kv_indices
        out = torch.empty_like(q)
        if self._extend is not None:
            extend_attention(q, k_cache, v_cache, kv_indices, self._extend, scale, out=out)
        d = self._decode
        if d is not None:
            decode_attention(q, k_cache, v_cache, kv_indices, d.q_rows, d.kv_starts, d.kv_lens, d.max_kv_len,
                             scale, out, d.q_rows)
        if self._cascade is not None:
            self._run_cascade(q, k_cache, v_cache, kv_indices, scale, out)
        return out

    def _run_cascade(self, q, k_cache, v_cache, kv_indices, scale: float, out: torch.Tensor) -> None:
        c = self._cascade
        q_g = q[c.member_rows]
        o_parts = torch.empty(q_g.shape[0], q.shape[1], 2, q.shape[2], dtype=torch.float32, device=q.device)
        lse_parts = torch.empty(q_g.shape[0], q.shape[1], 2, dtype=torch.float32, device=q.device)
        _, lse = extend_attention(q_g, k_cache, v_cache, kv_indices, c.prefix, scale, want_lse=True,
                                  out=o_parts[:, :, 0])
        lse_parts[:, :, 0] = lse
        s = c.suffix
        decode_attention(q_g, k_cache, v_cache, kv_indices, s.q_rows, s.kv_starts, s.kv_lens, s.max_kv_len, scale,
                         o_parts[:, :, 1], s.q_rows, lse_parts[:, :, 1])
        merge_states(o_parts, lse_parts, out, c.member_rows)
