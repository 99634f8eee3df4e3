"""Every registered attention backend, planned once and run per layer, against attention written from
its definition one query at a time (the oracle), on scattered KV slots."""
from __future__ import annotations

import math

import pytest
import torch

from radixlang.kernels.backend import AttentionBatch, tree_visibility
from radixlang.kernels.registry import ATTENTION_BACKENDS, create_backend, resolve_backend

HEADS, KV_HEADS, D, SLOTS, LAYERS = 4, 2, 8, 96, 2


def naive(q, k_cache, v_cache, seqs):
    """seqs: per sequence (KV slots in position order, number of new tokens, visible(j) -> KV indices)."""
    out, row = [], 0
    for slots, n, visible in seqs:
        for j in range(n):
            idx = visible(j)
            for h in range(HEADS):
                kh = h // (HEADS // KV_HEADS)
                w = torch.softmax(k_cache[slots[idx], kh] @ q[row, h] / math.sqrt(D), 0)
                out.append(w @ v_cache[slots[idx], kh])
            row += 1
    return torch.stack(out).view(q.shape)


def chain(total: int, n: int):
    return lambda j: list(range(total - n + j + 1))


def tree(total: int, parents: list[int]):
    prefix, seen = total - len(parents), tree_visibility(parents)
    return lambda j: list(range(prefix)) + [prefix + i for i in range(len(parents)) if seen[j, i]]


def scenario(kv_lens, extend_lens, parents, seed=0):
    g = torch.Generator().manual_seed(seed)
    k_bufs = [torch.randn(SLOTS, KV_HEADS, D, generator=g) for _ in range(LAYERS)]
    v_bufs = [torch.randn(SLOTS, KV_HEADS, D, generator=g) for _ in range(LAYERS)]
    perm = torch.randperm(SLOTS, generator=g)
    table = torch.zeros(len(kv_lens), 32, dtype=torch.int32)
    slots_per_seq, start = [], 0
    for i, n in enumerate(kv_lens):
        slots_per_seq.append(perm[start:start + n])
        table[i, :n] = slots_per_seq[-1].int()
        start += n
    positions = [p for total, n in zip(kv_lens, extend_lens) for p in range(total - n, total)]
    batch = AttentionBatch(table, list(range(len(kv_lens))), kv_lens, extend_lens, positions, parents)
    tokens = sum(extend_lens)
    q, k, v = (torch.randn(tokens, h, D, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))
    return k_bufs, v_bufs, slots_per_seq, batch, q, k, v


@pytest.mark.parametrize("name", sorted(ATTENTION_BACKENDS))
def test_mixed_decode_and_extend_batch_matches_definition_on_every_layer(name):
    kv_lens, extend_lens = [5, 9, 1, 7, 12], [1, 4, 1, 7, 1]  # decode, extend on prefix, first token, prefill
    k_bufs, v_bufs, slots, batch, q, k, v = scenario(kv_lens, extend_lens, [None] * 5)
    backend = create_backend(name, k_bufs, v_bufs)
    plan = backend.plan(batch)
    assert plan.positions.tolist() == batch.positions
    assert plan.kv_indices.tolist() == torch.cat(slots).tolist()
    new_slots = torch.cat([s[-n:] for s, n in zip(slots, extend_lens)])
    seqs = [(s, n, chain(total, n)) for s, total, n in zip(slots, kv_lens, extend_lens)]
    for layer in range(LAYERS):  # one plan serves every layer, each over its own buffers
        out = backend.forward(q * (layer + 1), k, v, layer, 1 / math.sqrt(D))
        assert torch.equal(k_bufs[layer][new_slots], k) and torch.equal(v_bufs[layer][new_slots], v)
        expected = naive(q * (layer + 1), k_bufs[layer], v_bufs[layer], seqs)
        assert torch.allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("name", sorted(ATTENTION_BACKENDS))
def test_token_tree_sees_prefix_and_ancestors_only(name):
    parents = [-1, 0, 0, 1, 2, -1]  # two roots: a branchy tree and a lone sibling
    kv_lens, extend_lens = [10, 6], [6, 1]
    k_bufs, v_bufs, slots, batch, q, k, v = scenario(kv_lens, extend_lens, [parents, None], seed=1)
    backend = create_backend(name, k_bufs, v_bufs)
    backend.plan(batch)
    out = backend.forward(q, k, v, 0, 1 / math.sqrt(D))
    expected = naive(q, k_bufs[0], v_bufs[0], [(slots[0], 6, tree(10, parents)), (slots[1], 1, chain(6, 1))])
    assert torch.allclose(out, expected, atol=1e-5)


@pytest.mark.parametrize("kv_lens", [[7], [6, 6, 6], [3, 11, 6]])  # one sequence, equal lengths, padded
def test_decode_only_steps_match_definition(kv_lens):
    k_bufs, v_bufs, slots, batch, q, k, v = scenario(kv_lens, [1] * len(kv_lens), [None] * len(kv_lens), seed=2)
    backend = create_backend("torch", k_bufs, v_bufs)
    backend.plan(batch)
    assert backend.decode_only
    out = backend.forward(q, k, v, 0, 1 / math.sqrt(D))
    expected = naive(q, k_bufs[0], v_bufs[0], [(s, 1, chain(n, 1)) for s, n in zip(slots, kv_lens)])
    assert torch.allclose(out, expected, atol=1e-5)


def test_a_step_with_a_prompt_chunk_is_not_decode_only():
    k_bufs, v_bufs, _, batch, *_ = scenario([5, 9], [1, 4], [None, None])
    backend = create_backend("torch", k_bufs, v_bufs)
    backend.plan(batch)
    assert not backend.decode_only


def test_a_chain_written_as_parents_equals_the_chain():
    kv_lens, extend_lens = [9], [5]
    k_bufs, v_bufs, _, batch, q, k, v = scenario(kv_lens, extend_lens, [None])
    backend = create_backend("torch", k_bufs, v_bufs)
    backend.plan(batch)
    as_chain = backend.forward(q, k, v, 0, 0.3)
    batch.parents = [[-1, 0, 1, 2, 3]]
    backend.plan(batch)
    assert torch.equal(backend.forward(q, k, v, 0, 0.3), as_chain)


def test_unknown_backend_names_are_refused_and_auto_resolves():
    assert resolve_backend("auto", torch.device("cpu")) in ATTENTION_BACKENDS
    with pytest.raises(ValueError, match="attention_backend"):
        resolve_backend("flashinfer-please", torch.device("cpu"))
