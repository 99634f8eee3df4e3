"""EPLB: placements keep every logical expert reachable with bounded rank loads (hypothesis), and applying
one to a running engine leaves its outputs unchanged while spreading hot experts' tokens over replicas."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlang.runtime.engine import Engine
from radixlang.runtime.models.eplb import Placement, balanced_packing, place_experts, replicate
from radixlang.runtime.models.moe import ExpertTable

from .hf_tiny import one_thread
from .test_moe_parity import build, prompts

pytestmark = pytest.mark.usefixtures(one_thread.__name__)  # the fixture, imported


@st.composite
def problems(draw):
    ranks = draw(st.sampled_from([1, 2, 4, 8]))
    nodes = draw(st.sampled_from([n for n in (1, 2, 4) if ranks % n == 0]))
    groups = draw(st.sampled_from([1, 2, 4, 8]))
    experts = groups * draw(st.integers(1, 6))
    per_rank = draw(st.integers(1, 4))
    physical = ranks * per_rank
    if physical < experts or (physical // nodes) * nodes != physical:
        physical = ranks * -(-experts // ranks)
    load = draw(st.lists(st.integers(0, 1000), min_size=experts, max_size=experts))
    return load, physical, ranks, groups, nodes


@settings(max_examples=150, deadline=None)
@given(problems())
def test_placement_reaches_every_expert_and_bounds_rank_loads(problem):
    load, physical, ranks, groups, nodes = problem
    if physical % ranks or groups % nodes == 0 and (physical // nodes) < len(load) // nodes:
        return  # a node cannot hold its groups' experts: not a valid problem
    placement = place_experts(load, physical, ranks, groups, nodes)
    assert len(placement.phys_to_logical) == physical
    assert set(placement.phys_to_logical) == set(range(len(load)))  # every logical expert reachable
    rank_loads = placement.rank_loads(load)
    assert sum(rank_loads) == pytest.approx(sum(load))
    heaviest_replica = max(load[e] / placement.phys_to_logical.count(e) for e in range(len(load)))
    if nodes == 1 or groups % nodes:  # one node: greedy packing is within one item of the mean
        assert max(rank_loads) <= sum(load) / ranks + heaviest_replica + 1e-9


def test_replication_flattens_a_skewed_load():
    load = [600, 200, 60, 50, 40, 30, 10, 10]  # a hot expert and a warm one
    before = Placement(tuple(range(8)), 4).rank_loads(load)
    placement = place_experts(load, 12, 4)
    after = placement.rank_loads(load)
    assert max(before) / (sum(before) / 4) >= 2
    assert max(after) / (sum(after) / 4) <= 1.15
    assert placement.phys_to_logical.count(0) >= 3


def test_packing_and_replication_basics():
    assert sorted(balanced_packing([5, 1, 4, 2], 2)) == [0, 0, 1, 1]
    assert replicate([8, 1, 1], 5) == [0, 0, 0, 1, 2]
    with pytest.raises(ValueError, match="logical"):
        replicate([1, 1, 1], 2)
    with pytest.raises(ValueError, match="every logical expert"):
        ExpertTable.from_phys_to_logical([0, 0, 1], 3)


def test_rebalanced_engine_keeps_outputs_and_spreads_replicas(tmp_path):
    build(tmp_path, "qwen3-moe")
    batch = prompts(4)
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    with Engine(str(tmp_path / "qwen3-moe"), device="cpu", kv_cache_tokens=1024, max_prefill_tokens=128,
                disable_radix_cache=True) as engine:
        before = engine.generate(input_ids=batch, sampling_params=params)
        load = engine.expert_load()
        tokens = sum(len(p) + 8 - 1 for p in batch)  # every forwarded token is routed to top-2 experts
        assert load.shape == (2, 6) and load.sum(dim=1).tolist() == [2 * tokens] * 2
        placements = engine.rebalance_experts(num_physical=8, num_ranks=2)
        hot = int(load[0].argmax())
        assert placements[0].phys_to_logical.count(hot) == 2 or load[0].max() * 2 < load[0].sum() / 3
        assert engine.expert_load().sum() == 0
        after = engine.generate(input_ids=batch, sampling_params=params)
        engine.check_invariants()
    assert [o.output_ids for o in after] == [o.output_ids for o in before]


def test_replicas_split_a_hot_experts_tokens():
    table = ExpertTable.from_phys_to_logical([0, 1, 0, 2, 3, 0], 4)
    ids = torch.zeros(9, 1, dtype=torch.int64)
    phys = table.to_physical(ids).flatten().tolist()
    assert sorted(phys) == [0, 0, 0, 2, 2, 2, 5, 5, 5]
