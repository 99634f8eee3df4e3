"""build_plan's index tensors, computed in a fixed number of tensor ops, against slicing each sequence's
row of req_to_token one at a time (the definition)."""
from __future__ import annotations

import random

import pytest
import torch

from radixlang.kernels.backend import AttentionBatch, build_plan, offsets


def sliced_plan(batch: AttentionBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indices, out_cache_loc) one sequence at a time."""
    table = batch.req_to_token
    kv = [table[r, :n] for r, n in zip(batch.rows, batch.kv_lens)]
    new = [table[r, n - e:n] for r, n, e in zip(batch.rows, batch.kv_lens, batch.extend_lens)]
    return torch.cat(kv).long(), torch.cat(new).long()


def random_batch(rng: random.Random, n: int, width: int = 64) -> AttentionBatch:
    table = torch.randint(0, 10_000, (2 * n + 3, width), dtype=torch.int32,
                          generator=torch.Generator().manual_seed(rng.randrange(1 << 30)))
    rows = rng.sample(range(table.shape[0]), n)
    extend = [rng.choice([1, 1, 1, rng.randint(2, 9)]) for _ in range(n)]
    kv = [rng.randint(e, width) for e in extend]
    positions = [p for k, e in zip(kv, extend) for p in range(k - e, k)]
    return AttentionBatch(table, rows, kv, extend, positions, [None] * n)


@pytest.mark.parametrize("n", [1, 2, 8, 9, 64, 300])  # FEW_RUNS = 8: slices up to 8, gathers beyond
def test_plan_indices_match_slicing_each_sequence(n):
    rng = random.Random(n)
    for _ in range(5):
        batch = random_batch(rng, n)
        plan = build_plan(batch, torch.device("cpu"))
        kv_indices, out_cache_loc = sliced_plan(batch)
        assert torch.equal(plan.kv_indices, kv_indices)
        assert torch.equal(plan.out_cache_loc, out_cache_loc)
        assert plan.kv_indices.dtype == plan.out_cache_loc.dtype == torch.int64
        assert plan.qo_indptr.tolist() == offsets(batch.extend_lens)
        assert plan.kv_indptr.tolist() == offsets(batch.kv_lens)
        assert plan.positions.tolist() == batch.positions
        assert (plan.max_q_len, plan.max_kv_len) == (max(batch.extend_lens), max(batch.kv_lens))


def test_offsets_are_running_sums():
    assert offsets([]) == [0]
    assert offsets([3, 1, 4]) == [0, 3, 4, 8]
