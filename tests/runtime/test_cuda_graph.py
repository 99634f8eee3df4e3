"""The padded static-buffer decode path (what CUDA graphs replay), run eagerly on the CPU: bucket choice,
padding layout, and greedy tokens and logprobs equal to the normal path on both attention backends."""
from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import pytest
import torch

from radixlang.kernels.registry import ATTENTION_BACKENDS
from radixlang.runtime.batch import prefix_groups
from radixlang.runtime.config import EngineConfig
from radixlang.runtime.execution import cuda_graph, model_runner
from radixlang.runtime.execution.cuda_graph import batch_buckets, bucket_for, pack_decode


@pytest.mark.parametrize("max_batch,want", [(1, [1]), (2, [1, 2]), (8, [1, 2, 4, 8]), (5, [1, 2, 4, 5]),
                                            (64, [1, 2, 4, 8, 16, 32, 64]), (100, [1, 2, 4, 8, 16, 32, 64, 100])])
def test_buckets_are_powers_of_two_capped_by_the_largest_batch(max_batch, want):
    assert batch_buckets(max_batch) == want


def test_each_batch_runs_in_the_smallest_bucket_that_holds_it():
    for max_batch in (1, 3, 8, 13):
        buckets = batch_buckets(max_batch)
        for n in range(1, max_batch + 1):
            assert bucket_for(n, buckets) == min(b for b in buckets if b >= n)


def test_bad_graph_sizes_are_refused():
    with pytest.raises(ValueError, match="largest CUDA-graph batch"):
        batch_buckets(0)
    with pytest.raises(ValueError, match="cuda_graph_max_bs"):
        EngineConfig.from_options(cuda_graph_max_bs=0)


def test_graphs_default_on_for_cuda_only_and_cap_at_max_running_requests():
    assert not EngineConfig(device="cpu").use_decode_graphs()
    assert EngineConfig(device="cuda").use_decode_graphs()
    assert not EngineConfig(device="cuda", disable_cuda_graph=True).use_decode_graphs()
    assert EngineConfig(device="cpu", disable_cuda_graph=False).use_decode_graphs()
    assert EngineConfig(max_running_requests=16, cuda_graph_max_bs=64).decode_graph_max_bs() == 16
    assert EngineConfig(max_running_requests=16, cuda_graph_max_bs=4).decode_graph_max_bs() == 4


def test_padding_rows_follow_the_real_ones():
    out = torch.full((4, 8), -7, dtype=torch.int64)
    pack_decode([11, 12, 13], [5, 0, 2], [9, 4, 30], 4, out)
    assert out[:, :4].tolist() == [[11, 12, 13, 0], [5, 0, 2, 0], [9, 4, 30, 1], [1, 1, 1, 0]]
    assert (out[:, 4:] == -7).all()  # beyond the bucket: untouched


def test_cascade_layout_packs_members_group_by_group_then_the_rest():
    out = torch.full((cuda_graph.PREFIX_LENS + 1, 8), -7, dtype=torch.int64)
    pack_decode([11, 12, 13, 14, 15], [5, 0, 2, 7, 1], [9, 4, 30, 41, 33], 8, out)
    cuda_graph.pack_cascade([([3, 1], 40), ([0, 4, 2], 30)], 8, out)
    assert out[cuda_graph.ORDER].tolist() == [3, 1, 0, 4, 2, 5, 6, 7]  # then the padding rows
    assert out[cuda_graph.STARTS:].tolist() == [[0, 2, 0, 0] + [-7] * 4, [2, 3, 0, 0] + [-7] * 4,
                                                [40, 30, 0, 0] + [-7] * 4]  # room for 4 groups; 2 unused
    assert out[:4, :5].tolist() == [[11, 12, 13, 14, 15], [5, 0, 2, 7, 1], [9, 4, 30, 41, 33], [1] * 5]


PROMPTS = ["a", "the quick brown fox jumps", "one two three", "lorem ipsum dolor sit amet, consectetur",
           "x y", "numbers: 1 2 3 4 5 6 7", "why"]
LENGTHS = [9, 4, 12, 7, 3, 10, 6]  # requests finish at different steps: the batch shrinks through odd sizes


def generate_all(engine, count: int) -> list[tuple[list[int], list[float]]]:
    """The first `count` prompts at once, each with its own max_new_tokens: greedy ids and their logprobs."""
    def one(i: int):
        params = {"temperature": 0, "max_new_tokens": LENGTHS[i], "ignore_eos": True}
        out = engine.generate(PROMPTS[i], params, return_logprob=True)
        return out.output_ids, [lp.logprob for lp in out.meta.output_logprobs]

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


@pytest.mark.parametrize("backend", sorted(ATTENTION_BACKENDS))
def test_padded_decode_path_gives_the_normal_paths_greedy_tokens(tiny_engine_factory, monkeypatch, backend):
    steps = []  # (sequences, bucket) of every padded decode step
    real_forward = cuda_graph.DecodeGraphs.forward

    def spying_forward(self, batch, groups=None):
        steps.append((len(batch.items), bucket_for(len(batch.items), self.buckets)))
        return real_forward(self, batch, groups)

    monkeypatch.setattr(cuda_graph.DecodeGraphs, "forward", spying_forward)
    options = {"attention_backend": backend, "context_length": 64, "max_running_requests": 8}
    normal = tiny_engine_factory(**options)
    padded = tiny_engine_factory(disable_cuda_graph=False, **options)
    assert normal.runner.graphs is None and padded.runner.graphs.graphs == {}  # no capture
    for count in (3, 7):
        want, got = generate_all(normal, count), generate_all(padded, count)
        assert [ids for ids, _ in got] == [ids for ids, _ in want]
        for (_, lp_got), (_, lp_want) in zip(got, want):
            assert torch.allclose(torch.tensor(lp_got), torch.tensor(lp_want), atol=1e-4)
    assert any(b > n for n, b in steps) and {n for n, _ in steps} >= {1, 3}  # padded steps, odd sizes
    normal.check_invariants()
    padded.check_invariants()


@pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")
def test_decodes_sharing_a_cascade_prefix_run_in_the_padded_cascade_path(tiny_engine_factory, monkeypatch):
    shared = "one shared instruction for all. " * 2
    # three requests share the prefix, two do not: a bucket of 8 with a group, ungrouped rows and padding
    prompts = [shared + q for q in ("Why?", "How so?", "Where to?")] + ["unrelated", "x y"]
    greedy = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}

    def run(engine) -> list[tuple[list[int], list[float]]]:
        engine.generate(shared, greedy)  # the shared prefix enters the radix tree
        outs = engine.generate(prompts, greedy, return_logprob=True)
        engine.check_invariants()
        return [(o.output_ids, [lp.logprob for lp in o.meta.output_logprobs]) for o in outs]

    options = {"context_length": 64, "max_running_requests": 8}
    want = run(tiny_engine_factory(attention_backend="torch", **options))
    engines = {graphs: tiny_engine_factory(attention_backend="triton", disable_cuda_graph=not graphs, **options)
               for graphs in (False, True)}
    # the scheduler puts grouped requests first; members listed backwards make the cascade's order a real
    # permutation (any order of a group's members is a valid group)
    monkeypatch.setattr(model_runner, "prefix_groups", lambda items, min_len: [
        (members[::-1], length) for members, length in prefix_groups(items, min_len)])
    eager = engines[False].runner
    eager.cascade_min = engines[True].runner.cascade_min = 8
    padded = engines[True].runner.graphs
    eager_groups, padded_groups = [], []
    real_plan, real_forward = eager.attn.plan, padded.forward
    monkeypatch.setattr(eager.attn, "plan", lambda batch: eager_groups.append(batch.prefix_groups) or real_plan(batch))
    monkeypatch.setattr(padded, "forward", lambda batch, groups=None: padded_groups.append(groups)
                        or real_forward(batch, groups))
    for engine in engines.values():
        got = run(engine)
        assert [ids for ids, _ in got] == [ids for ids, _ in want]
        for (_, lp_got), (_, lp_want) in zip(got, want):
            assert torch.allclose(torch.tensor(lp_got), torch.tensor(lp_want), atol=1e-4)
    sizes = [{len(members) for step in steps if step for members, _ in step} for steps in (eager_groups, padded_groups)]
    assert sizes == [{3}, {3}]  # the three share a cascade, eagerly in one engine, padded in the other
    assert padded.steps[(8, True)] > 0  # padded to a bucket of 8: a group, ungrouped rows and padding rows


def test_a_graph_keeps_the_groups_that_save_the_most_reads_when_they_outnumber_its_room():
    assert cuda_graph.max_groups(1) == 0 and cuda_graph.max_groups(7) == 3
    assert cuda_graph.max_groups(256) == cuda_graph.MAX_GRAPH_GROUPS
    groups = [([0, 1], 300), ([2, 3, 4], 260), ([5, 6], 900), ([7, 8], 256)]  # saves 300, 520, 900, 256 reads
    assert cuda_graph.largest_groups(groups, 2) == [([5, 6], 900), ([2, 3, 4], 260)]
    assert cuda_graph.largest_groups(groups, 4) == groups


@pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")
def test_members_of_groups_a_graph_has_no_room_for_stay_exact(tiny_engine_factory, monkeypatch):
    # room for one group per graph: of two groups, the one sharing the longer prefix is kept, the other's
    # members attend over their whole KV in the same padded step
    monkeypatch.setattr(cuda_graph, "MAX_GRAPH_GROUPS", 1)
    shared = ["one shared instruction for all of them. " * 3, "a second, different preamble here. " * 2]
    prompts = [shared[1] + "How so?", "unrelated", shared[0] + "Why?", shared[1] + "Who?", shared[0] + "Where?"]
    greedy = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}

    def run(engine) -> list[tuple[list[int], list[float]]]:
        engine.generate(shared, greedy)  # both prefixes enter the radix tree
        outs = engine.generate(prompts, greedy, return_logprob=True)
        engine.check_invariants()
        return [(o.output_ids, [lp.logprob for lp in o.meta.output_logprobs]) for o in outs]

    options = {"context_length": 64, "max_running_requests": 8}
    want = run(tiny_engine_factory(attention_backend="torch", **options))
    engine = tiny_engine_factory(attention_backend="triton", disable_cuda_graph=False, **options)
    engine.runner.cascade_min = 8
    # the cache-aware scheduler admits the longer prefix's requests first: list its group last instead
    monkeypatch.setattr(model_runner, "prefix_groups", lambda items, min_len: prefix_groups(items, min_len)[::-1])
    graphs = engine.runner.graphs
    offered, packed = [], []  # per padded cascade step: the groups found, the groups packed
    real_forward, real_pack = graphs.forward, cuda_graph.pack_cascade
    monkeypatch.setattr(graphs, "forward", lambda batch, groups=None: offered.append(groups)
                        or real_forward(batch, groups))
    monkeypatch.setattr(cuda_graph, "pack_cascade", lambda groups, bucket, out: packed.append(groups)
                        or real_pack(groups, bucket, out))
    got = run(engine)
    assert [ids for ids, _ in got] == [ids for ids, _ in want]
    for (_, lp_got), (_, lp_want) in zip(got, want):
        assert torch.allclose(torch.tensor(lp_got), torch.tensor(lp_want), atol=1e-4)
    grouped = [groups for groups in offered if groups]
    assert any(len(groups) == 2 for groups in grouped) and graphs.steps[(8, True)] > 0
    assert len(packed) == len(grouped)
    for found, kept in zip(grouped, packed):
        assert kept == [max(found, key=lambda g: g[1])]  # two members each: the longer prefix saves more
