"""The Triton kernels (under TRITON_INTERPRET=1 on a CPU) against attention written from its definition:
GQA ratios, head_dim 64 and 128, fp32/bf16/fp16, empty prefixes, KV long enough to split, cascade
groups over a shared prefix, and the (o, lse) merge."""
from __future__ import annotations

import math

import pytest
import torch

from radixlang.kernels.backend import AttentionBatch
from radixlang.kernels.registry import ATTENTION_BACKENDS, create_backend

pytestmark = pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")


def oracle(q, k_cache, v_cache, slots, visible, scale):
    """q [n, heads, d]; slots [L] KV slots; visible(j) -> the KV positions query j sees."""
    heads, kv_heads = q.shape[1], k_cache.shape[1]
    out = torch.empty(q.shape, dtype=torch.float64)
    for j in range(q.shape[0]):
        idx = slots[visible(j)]
        for h in range(heads):
            kh = h // (heads // kv_heads)
            w = torch.softmax(k_cache[idx, kh].double() @ q[j, h].double() * scale, 0)
            out[j, h] = w @ v_cache[idx, kh].double()
    return out


def make(kv_lens, extend_lens, heads, kv_heads, d, dtype, shared=0, seed=0):
    """Scattered slots per sequence; the first `shared` slots are the same for every sequence."""
    g = torch.Generator().manual_seed(seed)
    num_slots = shared + sum(kv_lens) + 8
    k_cache = torch.randn(num_slots, kv_heads, d, generator=g).to(dtype)
    v_cache = torch.randn(num_slots, kv_heads, d, generator=g).to(dtype)
    perm = torch.randperm(num_slots, generator=g)
    common, rest = perm[:shared], perm[shared:]
    table = torch.zeros(len(kv_lens), max(kv_lens), dtype=torch.int32)
    slots, start = [], 0
    for i, n in enumerate(kv_lens):
        s = torch.cat((common, rest[start:start + n - shared]))
        start += n - shared
        table[i, :n] = s.int()
        slots.append(s)
    positions = [p for total, n in zip(kv_lens, extend_lens) for p in range(total - n, total)]
    batch = AttentionBatch(table, list(range(len(kv_lens))), kv_lens, extend_lens, positions, [None] * len(kv_lens))
    tokens = sum(extend_lens)
    q = torch.randn(tokens, heads, d, generator=g).to(dtype)
    k = torch.randn(tokens, kv_heads, d, generator=g).to(dtype)
    v = torch.randn(tokens, kv_heads, d, generator=g).to(dtype)
    return k_cache, v_cache, slots, batch, q, k, v


def expected(q, k_cache, v_cache, slots, batch, scale):
    rows, outs = 0, []
    for s, total, n in zip(slots, batch.kv_lens, batch.extend_lens):
        outs.append(oracle(q[rows:rows + n], k_cache, v_cache, s, lambda j, t=total, n=n: list(range(t - n + j + 1)),
                           scale))
        rows += n
    return torch.cat(outs)


TOL = {torch.float32: 2e-5, torch.bfloat16: 3e-2, torch.float16: 4e-3}


@pytest.mark.parametrize("heads,kv_heads,d", [(9, 3, 64), (4, 4, 128), (8, 2, 64)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_extend_and_decode_match_the_definition(heads, kv_heads, d, dtype):
    # a prefill with no prefix, an extend on a prefix, decodes (one long enough to split its KV)
    kv_lens, extend_lens = [20, 37, 9, 300], [20, 5, 1, 1]
    k_cache, v_cache, slots, batch, q, k, v = make(kv_lens, extend_lens, heads, kv_heads, d, dtype)
    backend = create_backend("triton", [k_cache], [v_cache])
    backend.plan(batch)
    out = backend.forward(q, k, v, 0, 1 / math.sqrt(d))
    want = expected(q, k_cache, v_cache, slots, batch, 1 / math.sqrt(d))
    assert out.dtype == dtype
    assert (out.double() - want).abs().max().item() < TOL[dtype]


def test_cascade_groups_read_the_shared_prefix_once_and_match_the_definition():
    heads, kv_heads, d, shared = 9, 3, 64, 40
    kv_lens, extend_lens = [45, 52, 41, 70, 48], [1, 1, 1, 1, 1]
    k_cache, v_cache, slots, batch, q, k, v = make(kv_lens, extend_lens, heads, kv_heads, d, torch.float32,
                                                   shared=shared, seed=3)
    batch.prefix_groups = [([0, 1, 2], shared), ([3, 4], 32)]  # nested use of the same prefix is fine too
    backend = create_backend("triton", [k_cache], [v_cache])
    backend.plan(batch)
    out = backend.forward(q, k, v, 0, 0.125)
    want = expected(q, k_cache, v_cache, slots, batch, 0.125)
    assert (out.double() - want).abs().max().item() < 2e-5
    plain = create_backend("triton", [k_cache.clone()], [v_cache.clone()])
    batch.prefix_groups = []
    plain.plan(batch)
    assert torch.allclose(plain.forward(q, k, v, 0, 0.125), out, atol=2e-5)


def test_merge_states_is_the_associative_lse_operator():
    from radixlang.kernels.triton_decode import merge_states

    g = torch.Generator().manual_seed(0)
    n, heads, parts, d = 3, 2, 4, 16
    scores = [torch.randn(n, heads, 5, generator=g) for _ in range(parts)]  # 5 keys per part
    values = [torch.randn(n, heads, 5, d, generator=g) for _ in range(parts)]
    o = torch.stack([torch.einsum("nhk,nhkd->nhd", s.softmax(-1), v) for s, v in zip(scores, values)], dim=2)
    lse = torch.stack([s.logsumexp(-1) for s in scores], dim=2)
    lse[0, 0, 1] = -torch.inf  # an empty part weighs nothing
    out, out_lse = torch.empty(n + 1, heads, d), torch.empty(n + 1, heads)
    merge_states(o.contiguous(), lse.contiguous(), out, torch.tensor([1, 2, 3]), out_lse)
    all_scores, all_values = torch.cat(scores, -1), torch.cat(values, 2)
    keep = torch.ones(n, heads, 5 * parts, dtype=torch.bool)
    keep[0, 0, 5:10] = False
    all_scores = all_scores.masked_fill(~keep, -torch.inf)
    want = torch.einsum("nhk,nhkd->nhd", all_scores.softmax(-1), all_values)
    assert torch.allclose(out[1:], want, atol=1e-5)
    assert torch.allclose(out_lse[1:], all_scores.logsumexp(-1), atol=1e-5)
