"""Torch reference attention over scattered KV slots vs a per-query loop written from the definition."""
from __future__ import annotations

import math

import torch

from radixlang.kernels.backend import AttentionMetadata
from radixlang.kernels.reference import TorchAttention


def naive(q, k_cache, v_cache, slots_per_seq, extend_lens, heads, kv_heads):
    out, row = [], 0
    for slots, n in zip(slots_per_seq, extend_lens):
        total = len(slots)
        for j in range(n):
            pos = total - n + j
            for h in range(heads):
                kh = h // (heads // kv_heads)
                keys = k_cache[slots[: pos + 1], kh]
                vals = v_cache[slots[: pos + 1], kh]
                w = torch.softmax(keys @ q[row, h] / math.sqrt(q.shape[-1]), 0)
                out.append(w @ vals)
            row += 1
    return torch.stack(out).view(q.shape)


def test_mixed_decode_and_extend_batch_matches_definition():
    g = torch.Generator().manual_seed(0)
    heads, kv_heads, d, num_slots = 4, 2, 8, 64
    k_cache = torch.randn(num_slots, kv_heads, d, generator=g)
    v_cache = torch.randn(num_slots, kv_heads, d, generator=g)
    perm = torch.randperm(num_slots, generator=g)
    seq_lens, extend_lens = [5, 9, 1, 7], [1, 4, 1, 7]  # decode, extend on prefix, first token, prefill
    table = torch.zeros(4, 16, dtype=torch.int32)
    slots_per_seq, start = [], 0
    for i, n in enumerate(seq_lens):
        slots = perm[start : start + n]
        start += n
        table[i, :n] = slots.int()
        slots_per_seq.append(slots)
    new_slots = torch.cat([s[-n:] for s, n in zip(slots_per_seq, extend_lens)])
    tokens = sum(extend_lens)
    q = torch.randn(tokens, heads, d, generator=g)
    k = torch.randn(tokens, kv_heads, d, generator=g)
    v = torch.randn(tokens, kv_heads, d, generator=g)
    meta = AttentionMetadata(table, torch.arange(4), seq_lens, extend_lens, new_slots)
    out = TorchAttention().forward(q, k, v, k_cache, v_cache, meta, 1 / math.sqrt(d))
    assert torch.equal(k_cache[new_slots], k) and torch.equal(v_cache[new_slots], v)
    expected = naive(q, k_cache, v_cache, slots_per_seq, extend_lens, heads, kv_heads)
    assert torch.allclose(out, expected, atol=1e-5)
