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


@pytest.mark.parametrize("parts", [4, 3])  # 3: the cascade's prefix + suffix splits need not be a power of two
def test_merge_states_is_the_associative_lse_operator(parts):
    from radixlang.kernels.triton.decode import merge_states

    g = torch.Generator().manual_seed(0)
    n, heads, d = 3, 2, 16
    scores = [torch.randn(n, heads, 5, generator=g) for _ in range(parts)]  # 5 keys per part
    values = [torch.randn(n, heads, 5, d, generator=g) for _ in range(parts)]
    o = torch.stack([torch.einsum("nhk,nhkd->nhd", s.softmax(-1), v) for s, v in zip(scores, values)], dim=2)
    lse = torch.stack([s.logsumexp(-1) for s in scores], dim=2)
    lse[0, 0, 1] = -torch.inf  # an empty part weighs nothing
    o[0, 0, 1] = torch.nan  # and is never read (a cascade leaves such parts unwritten)
    all_scores, all_values = torch.cat(scores, -1), torch.cat(values, 2)
    keep = torch.ones(n, heads, 5 * parts, dtype=torch.bool)
    keep[0, 0, 5:10] = False
    all_scores = all_scores.masked_fill(~keep, -torch.inf)
    want = torch.einsum("nhk,nhkd->nhd", all_scores.softmax(-1), all_values)
    # parts laid out row-major, and parts-major (strided views: the cascade's layout)
    for o_parts, lse_parts in ((o.contiguous(), lse.contiguous()),
                               (o.permute(2, 0, 1, 3).contiguous().permute(1, 2, 0, 3),
                                lse.permute(2, 0, 1).contiguous().permute(1, 2, 0))):
        out, out_lse = torch.empty(n + 1, heads, d), torch.empty(n + 1, heads)
        merge_states(o_parts, lse_parts, out, torch.tensor([1, 2, 3]), out_lse)
        assert torch.allclose(out[1:], want, atol=1e-5)
        assert torch.allclose(out_lse[1:], all_scores.logsumexp(-1), atol=1e-5)


def test_gqa_packed_rows_match_the_definition_across_row_blocks():
    # one call, three kinds: a chain of 50 new tokens on 22 cached (150 (query, head) rows: two 128-row
    # programs per KV head, query 42 split between them, and its own key the first of a 32-key block), a
    # token tree, and a MASK_NONE pass (a cascade prefix) with LSE
    from radixlang.kernels.backend import tree_visibility
    from radixlang.kernels.triton.extend import MASK_CAUSAL, MASK_NONE, MASK_TREE, ExtendSeqs, extend_attention

    heads, kv_heads, d, scale = 9, 3, 64, 0.125
    parents = [-1, 0, 0, 1, 2, -1, 5]
    kv_lens, q_lens = [72, 27, 70], [50, len(parents), 45]
    g = torch.Generator().manual_seed(5)
    num_slots = sum(kv_lens)
    k_cache = torch.randn(num_slots, kv_heads, d, generator=g)
    v_cache = torch.randn(num_slots, kv_heads, d, generator=g)
    kv_indices = torch.randperm(num_slots, generator=g)
    q = torch.randn(sum(q_lens), heads, d, generator=g)
    q_starts, kv_starts = [0, 50, 57], [0, 72, 99]
    seqs = ExtendSeqs.build(q_starts, q_lens, kv_starts, kv_lens, [MASK_CAUSAL, MASK_TREE, MASK_NONE],
                            [None, tree_visibility(parents), None], torch.device("cpu"))
    lse = torch.full((sum(q_lens), heads), float("nan"))
    out = extend_attention(q, k_cache, v_cache, kv_indices, seqs, scale, lse=lse)
    seen = tree_visibility(parents)
    visible = [lambda j: list(range(22 + j + 1)),
               lambda j: list(range(20)) + [20 + i for i in range(len(parents)) if seen[j, i]],
               lambda j: list(range(70))]
    for qs, n, ks, total, vis in zip(q_starts, q_lens, kv_starts, kv_lens, visible):
        slots = kv_indices[ks:ks + total]
        want = oracle(q[qs:qs + n], k_cache, v_cache, slots, vis, scale)
        assert (out[qs:qs + n].double() - want).abs().max() < 2e-5
        for j in range(n):
            for h in range(heads):
                scores = k_cache[slots[vis(j)], h // 3].double() @ q[qs + j, h].double() * scale
                assert abs(lse[qs + j, h].item() - scores.logsumexp(0).item()) < 1e-4


def test_gqa_packing_cuts_extend_programs_by_the_group():
    from radixlang.kernels.triton.extend import extend_grid

    # a cascade prefix split of 64 members: 3 KV heads x 2 blocks of 128 rows, not 9 query heads x 2 of 32
    assert extend_grid(1, 64, 9, 3) == (1, 3, 2)
    assert extend_grid(1, 4, 32, 8) == (1, 8, 1)  # 4 members x 4 heads: one 16-row program per KV head
    assert extend_grid(2, 20, 4, 4) == (2, 4, 1)  # no GQA: a program per head, up to 32 queries, as before


def cascade_step(kv_lens, groups, width, heads, kv_heads, d, dtype, pad, seed=0):
    """Sequence i holds kv_lens[i] scattered slots in table row 2 * i + 1; a group's members share their
    first `length` slots (the first member's); then `pad` padding rows (row 0, one key, the padding slot),
    all as the padded decode batch of a CUDA graph with the group layout packed as its host does it."""
    from radixlang.kernels.backend import DecodeBatch, DecodeGroups
    from radixlang.runtime.execution.cuda_graph import ORDER, PREFIX_LENS, STARTS, max_groups, pack_cascade

    g = torch.Generator().manual_seed(seed)
    num_slots = sum(kv_lens) + 2
    pad_slot = num_slots - 1
    k_cache = torch.randn(num_slots, kv_heads, d, generator=g).to(dtype)
    v_cache = torch.randn(num_slots, kv_heads, d, generator=g).to(dtype)
    fresh = torch.randperm(num_slots - 1, generator=g)
    slots, start = [], 0
    for n in kv_lens:
        slots.append(fresh[start:start + n].clone())
        start += n
    for members, length in groups:
        for i in members[1:]:
            slots[i][:length] = slots[members[0]][:length]
    table = torch.zeros(2 * len(kv_lens) + 1, width, dtype=torch.int32)
    for i, s in enumerate(slots):
        table[2 * i + 1, :len(s)] = s.int()
    b = len(kv_lens) + pad
    rows = torch.tensor([2 * i + 1 for i in range(len(kv_lens))] + [0] * pad)
    lens = torch.tensor(kv_lens + [1] * pad)
    loc = torch.tensor([s[-1].item() for s in slots] + [pad_slot] * pad)
    packed = torch.full((PREFIX_LENS + 1, b), -1, dtype=torch.int64)
    pack_cascade(groups, b, packed)
    layout = DecodeGroups(packed[ORDER], *packed[STARTS:, :max_groups(b)])
    q = torch.randn(b, heads, d, generator=g).to(dtype)
    k = torch.randn(b, kv_heads, d, generator=g).to(dtype)
    v = torch.randn(b, kv_heads, d, generator=g).to(dtype)
    return k_cache, v_cache, slots, DecodeBatch(table, rows, lens, loc, width, layout), q, k, v


@pytest.mark.parametrize("heads,kv_heads,d,dtype", [(9, 3, 64, torch.float32), (9, 3, 64, torch.bfloat16),
                                                    (4, 2, 64, torch.float32), (8, 2, 128, torch.float16)])
def test_fixed_shape_cascade_decode_matches_the_definition(heads, kv_heads, d, dtype):
    # a group whose prefix spans several KV splits (some left empty), a group shorter than one split, an
    # ungrouped sequence between members, two padding rows, and two unused groups (bucket 8 has room for 4)
    width = 200
    kv_lens = [170, 45, 12, 160, 44, 152]
    groups = [([0, 3, 5], 150), ([1, 4], 40)]
    k_cache, v_cache, slots, batch, q, k, v = cascade_step(kv_lens, groups, width, heads, kv_heads, d, dtype, pad=2)
    backend = create_backend("triton", [k_cache], [v_cache])
    backend.plan_decode(batch)
    assert backend._cascade is not None and backend._cascade.prefix_splits > 1  # several prefix splits
    out = backend.forward(q, k, v, 0, 1 / math.sqrt(d))
    real = len(kv_lens)
    want = torch.cat([oracle(q[i:i + 1], k_cache, v_cache, s, lambda j, n=n: list(range(n)), 1 / math.sqrt(d))
                      for i, (s, n) in enumerate(zip(slots, kv_lens))])
    assert out.dtype == dtype
    assert (out[:real].double() - want).abs().max().item() < TOL[dtype]
    assert torch.isfinite(out[real:]).all()
    assert torch.equal(k_cache[-1], k[-1].to(dtype))  # padding wrote the padding slot


@pytest.mark.parametrize("heads,kv_heads,d", [(8, 1, 64), (6, 2, 80)])  # GQA 8; a head_dim padded to BLOCK_D
def test_a_bucket_of_two_holding_one_group_whose_prefix_is_all_but_its_shortest_members_new_token(heads, kv_heads, d):
    # bucket 2 has room for exactly one group; the prefix (37) is no multiple of BLOCK_N, and is as long as
    # a prefix can be: the shorter member's suffix is its new token alone
    kv_lens, groups = [38, 41], [([1, 0], 37)]
    k_cache, v_cache, slots, batch, q, k, v = cascade_step(kv_lens, groups, 48, heads, kv_heads, d, torch.float32,
                                                           pad=0)
    backend = create_backend("triton", [k_cache], [v_cache])
    backend.plan_decode(batch)
    out = backend.forward(q, k, v, 0, 1 / math.sqrt(d))
    want = torch.cat([oracle(q[i:i + 1], k_cache, v_cache, s, lambda j, n=n: list(range(n)), 1 / math.sqrt(d))
                      for i, (s, n) in enumerate(zip(slots, kv_lens))])
    assert (out.double() - want).abs().max().item() < TOL[torch.float32]
