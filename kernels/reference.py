"""Torch reference attention over the token-granular paged KV: runs anywhere, and is the test oracle."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .backend import AttentionMetadata


class TorchAttention:
    """Decodes are padded into one batched call; each extend (prefill chunk) runs on its own."""

    def forward(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        k_cache: torch.Tensor,
        v_cache: torch.Tensor,
        meta: AttentionMetadata,
        scale: float,
    ) -> torch.Tensor:
        k_cache[meta.out_cache_loc] = k.to(k_cache.dtype)
        v_cache[meta.out_cache_loc] = v.to(v_cache.dtype)
        out = torch.empty_like(q)
        starts = [0]
        for n in meta.extend_lens:
            starts.append(starts[-1] + n)
        decode_rows = [i for i, n in enumerate(meta.extend_lens) if n == 1]
        if decode_rows:
            rows = torch.tensor([starts[i] for i in decode_rows], device=q.device)
            out[rows] = self._decode(q[rows], k_cache, v_cache, meta, decode_rows, scale)
        for i, n in enumerate(meta.extend_lens):
            if n > 1:
                sl = slice(starts[i], starts[i + 1])
                out[sl] = self._extend(q[sl], k_cache, v_cache, meta, i, scale)
        return out

    @staticmethod
    def _kv_slots(meta: AttentionMetadata, i: int) -> torch.Tensor:
        return meta.req_to_token[meta.req_pool_indices[i], : meta.seq_lens[i]].long()

    def _extend(self, q, k_cache, v_cache, meta: AttentionMetadata, i: int, scale: float):
        slots = self._kv_slots(meta, i)
        n, total = q.shape[0], meta.seq_lens[i]
        k = k_cache[slots].transpose(0, 1).unsqueeze(0).to(q.dtype)  # [1, kv_heads, L, d]
        v = v_cache[slots].transpose(0, 1).unsqueeze(0).to(q.dtype)
        qh = q.transpose(0, 1).unsqueeze(0)  # [1, heads, n, d]
        # query j sits at absolute position total - n + j and sees keys 0..that position
        q_pos = torch.arange(total - n, total, device=q.device)
        mask = torch.arange(total, device=q.device)[None, :] <= q_pos[:, None]
        o = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        return o[0].transpose(0, 1)

    def _decode(self, q, k_cache, v_cache, meta: AttentionMetadata, rows: list[int], scale: float):
        lens = [meta.seq_lens[i] for i in rows]
        max_len = max(lens)
        slot_table = meta.req_to_token[meta.req_pool_indices[rows], :max_len].long()
        valid = torch.arange(max_len, device=q.device)[None, :] < torch.tensor(
            lens, device=q.device
        )[:, None]
        slot_table = torch.where(valid, slot_table, torch.zeros_like(slot_table))
        k = k_cache[slot_table].permute(0, 2, 1, 3).to(q.dtype)  # [b, kv_heads, L, d]
        v = v_cache[slot_table].permute(0, 2, 1, 3).to(q.dtype)
        qh = q.unsqueeze(2)  # [b, heads, 1, d]
        mask = valid[:, None, None, :]
        o = F.scaled_dot_product_attention(qh, k, v, attn_mask=mask, scale=scale, enable_gqa=True)
        return o.squeeze(2)
