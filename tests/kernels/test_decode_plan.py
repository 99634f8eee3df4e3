"""Fixed-shape decode plans (what a CUDA graph captures): every backend, planned from device tensors with a
KV bound larger than any length, matches attention written from its definition; padding rows write only
the padding slot; the Triton plan reads each length from its tensor at run time, not when planned."""
from __future__ import annotations

import math

import pytest
import torch

from radixlang.kernels.backend import DecodeBatch
from radixlang.kernels.registry import ATTENTION_BACKENDS, create_backend

from .test_attention import HEADS, KV_HEADS, LAYERS, SLOTS, D, chain, naive

WIDTH = 32  # req_to_token columns: the plan's max_kv_len
PAD_SLOT = SLOTS - 1


def decode_scenario(kv_lens: list[int], seed: int = 0):
    """Sequence i holds kv_lens[i] scattered slots (never the padding slot) in row 2 * i of the table."""
    g = torch.Generator().manual_seed(seed)
    k_bufs = [torch.randn(SLOTS, KV_HEADS, D, generator=g) for _ in range(LAYERS)]
    v_bufs = [torch.randn(SLOTS, KV_HEADS, D, generator=g) for _ in range(LAYERS)]
    perm = torch.randperm(SLOTS - 1, generator=g)
    table = torch.zeros(2 * len(kv_lens), WIDTH, dtype=torch.int32)
    slots, start = [], 0
    for i, n in enumerate(kv_lens):
        slots.append(perm[start:start + n])
        table[2 * i, :n] = slots[-1].int()
        start += n
    return k_bufs, v_bufs, table, slots


def padded_batch(table: torch.Tensor, kv_lens: list[int], pad: int) -> DecodeBatch:
    """The real sequences, then `pad` padding rows (row 0, one key, writing to the padding slot)."""
    rows = torch.tensor([2 * i for i in range(len(kv_lens))] + [0] * pad)
    lens = torch.tensor(kv_lens + [1] * pad)
    real = torch.tensor([True] * len(kv_lens) + [False] * pad)
    loc = torch.where(real, table[rows, lens - 1].long(), PAD_SLOT)
    return DecodeBatch(table, rows, lens, loc, WIDTH)


@pytest.mark.parametrize("name", sorted(ATTENTION_BACKENDS))
def test_padded_fixed_shape_decode_matches_definition_and_writes_padding_to_the_pad_slot(name):
    kv_lens, pad = [5, 17, 1, 9, 32], 3
    k_bufs, v_bufs, table, slots = decode_scenario(kv_lens)
    before = [k.clone() for k in k_bufs]
    backend = create_backend(name, k_bufs, v_bufs)
    batch = padded_batch(table, kv_lens, pad)
    backend.plan_decode(batch)
    g = torch.Generator().manual_seed(1)
    b = len(kv_lens) + pad
    q, k, v = (torch.randn(b, h, D, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))
    seqs = [(s, 1, chain(n, 1)) for s, n in zip(slots, kv_lens)]
    for layer in range(LAYERS):
        out = backend.forward(q, k, v, layer, 1 / math.sqrt(D))
        real = len(kv_lens)
        assert torch.allclose(out[:real], naive(q[:real], k_bufs[layer], v_bufs[layer], seqs), atol=1e-5)
        assert torch.isfinite(out[real:]).all()
        written = torch.tensor([s[-1].item() for s in slots] + [PAD_SLOT])
        untouched = torch.ones(SLOTS, dtype=torch.bool)
        untouched[written] = False
        assert torch.equal(k_bufs[layer][untouched], before[layer][untouched])  # padding wrote nowhere else


@pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")
def test_triton_decode_plan_reads_lengths_from_device_tensors_at_run_time():
    kv_lens = [3, 20, 7]
    k_bufs, v_bufs, table, slots = decode_scenario([30] * len(kv_lens), seed=2)
    backend = create_backend("triton", k_bufs, v_bufs)
    batch = padded_batch(table, kv_lens, 1)
    backend.plan_decode(batch)
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(4, h, D, generator=g) for h in (HEADS, KV_HEADS, KV_HEADS))
    for grown in ([3, 20, 7], [4, 29, 16]):  # a replay sees new lengths (and write slots) in the same tensors
        batch.kv_lens[:3] = torch.tensor(grown)
        batch.out_cache_loc[:3] = table[batch.rows[:3], batch.kv_lens[:3] - 1].long()
        out = backend.forward(q, k, v, 0, 1 / math.sqrt(D))
        seqs = [(s, 1, chain(n, 1)) for s, n in zip(slots, grown)]
        assert torch.allclose(out[:3], naive(q[:3], k_bufs[0], v_bufs[0], seqs), atol=1e-5)
