"""The MLA latent decode and fused-MoE Triton kernels (under TRITON_INTERPRET=1 on a CPU) against their
definitions: attention over [c_kv | k_rope] rows written out per head, and each token's experts one by one."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from radixlang.kernels.registry import ATTENTION_BACKENDS

pytestmark = pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")


def mla_oracle(q, cache, seqs, rank, scale):
    out = torch.empty(q.shape[0], q.shape[1], rank, dtype=torch.float64)
    for b, slots in enumerate(seqs):
        rows = cache[slots, 0].double()
        for h in range(q.shape[1]):
            w = torch.softmax(rows @ q[b, h].double() * scale, 0)  # q . [c_kv | k_rope]
            out[b, h] = w @ rows[:, :rank]  # the values are the latents
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_mla_decode_matches_attention_over_the_latent_rows(dtype):
    from radixlang.kernels.triton.mla import mla_decode

    g = torch.Generator().manual_seed(0)
    rank, rope, heads = 32, 8, 20  # two head blocks, the second partly masked; rope padded to 16
    kv_lens = [1, 37, 70]
    cache = torch.randn(sum(kv_lens) + 5, 1, rank + rope, generator=g).to(dtype)
    perm = torch.randperm(cache.shape[0], generator=g)
    seqs, start = [], 0
    for n in kv_lens:
        seqs.append(perm[start:start + n])
        start += n
    q = torch.randn(len(kv_lens), heads, rank + rope, generator=g).to(dtype)
    lens = torch.tensor(kv_lens)
    scale = 0.3
    got = mla_decode(q, cache, torch.cat(seqs), torch.cumsum(lens, 0) - lens, lens, rank, scale)
    want = mla_oracle(q, cache, seqs, rank, scale)
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    assert got.shape == want.shape and (got.double() - want).abs().max() < tol


def moe_oracle(x, gate_up, down, ids, weights):
    out = torch.zeros_like(x, dtype=torch.float64)
    for t in range(x.shape[0]):
        for e, w in zip(ids[t].tolist(), weights[t].tolist()):
            gate, up = (gate_up[e].double() @ x[t].double()).chunk(2)
            out[t] += w * (down[e].double() @ (F.silu(gate) * up))
    return out


def test_fused_moe_matches_each_tokens_experts_one_by_one():
    from radixlang.kernels.triton.moe import align_by_expert, fused_moe

    g = torch.Generator().manual_seed(1)
    tokens, experts, k, hidden, inter = 13, 5, 2, 48, 40  # dims not multiples of the blocks: masks matter
    x = torch.randn(tokens, hidden, generator=g)
    gate_up = torch.randn(experts, 2 * inter, hidden, generator=g) * hidden**-0.5
    down = torch.randn(experts, hidden, inter, generator=g) * inter**-0.5
    ids = torch.stack([torch.randperm(experts, generator=g)[:k] for _ in range(tokens)])
    ids[:6, 0] = 4  # a hot expert: its run spans more than one row block
    ids[:6, 1] = torch.tensor([0, 1, 2, 3, 0, 1])
    weights = torch.rand(tokens, k, generator=g)
    rows = align_by_expert(ids, experts)
    assert rows.source.numel() % 16 == 0 and sorted(rows.source[rows.source >= 0].tolist()) == list(range(tokens * k))
    got = fused_moe(x, gate_up, down, ids, weights)
    assert (got.double() - moe_oracle(x, gate_up, down, ids, weights)).abs().max() < 1e-4


@torch.no_grad()
def test_moe_block_runs_the_fused_kernel_as_its_grouped_matmuls_with_replicas():
    from radixlang.runtime.models.moe import ExpertTable, MoeSpec
    from radixlang.runtime.models.moe_llama import SparseMoeBlock

    g = torch.Generator().manual_seed(2)
    block = SparseMoeBlock(MoeSpec(num_experts=6, top_k=2, intermediate_size=24, norm_topk_prob=True), 32)
    for p in block.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * p.shape[-1] ** -0.5)
    block.reset()
    block.set_table(ExpertTable.from_phys_to_logical([0, 1, 2, 3, 4, 5, 0, 3], 6))  # replicas of 0 and 3
    x = torch.randn(21, 32, generator=g)
    outs = []
    for fused in (False, True):
        block.experts.fused = fused
        outs.append(block(x))
    assert (outs[0] - outs[1]).abs().max() < 1e-5 * outs[0].abs().max()
