"""Expert parallelism over the tensor-parallel ranks (gloo, real worker processes): each rank holds half
the experts and the (token, expert) rows travel by all_to_all; greedy tokens and logprobs equal one rank's."""
from __future__ import annotations

import asyncio
import functools
import threading
from pathlib import Path

import pytest
import torch

from radixlang.runtime.completion import Completion
from radixlang.runtime.engine import Engine
from radixlang.runtime.kv.memory import KVPool
from radixlang.runtime.request import StreamChunk
from tests.runtime.models.hf_tiny import one_thread
from tests.runtime.models.test_moe_parity import build, prompts

pytestmark = pytest.mark.usefixtures(one_thread.__name__)  # the fixture, imported

GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}


def _generate(engine: Engine) -> list[Completion]:
    return engine.generate(input_ids=prompts(7), sampling_params=GREEDY, return_logprob=True, top_logprobs_num=3)


def _run(folder: Path, **options) -> tuple[list[Completion], torch.Tensor]:
    """The outputs, and the tokens each expert was sent."""
    with Engine(str(folder), device="cpu", kv_cache_tokens=1024, max_prefill_tokens=64, **options) as engine:
        out = _generate(engine)
        engine.check_invariants()
        return out, engine.expert_load()


# splitting over ranks moves fp32 sums (row-parallel partial products all-reduced, each rank's own GEMM
# blocking): Mixtral over 4 ranks differs from one rank by 1.02e-4 on an AVX-512 Xeon (under 1e-4 on AVX2);
# a wrong shard or expert moves a logprob by far more, and the ids and top tokens must match exactly
SPLIT_TOLERANCE = 2e-4


def _assert_same(one: list[Completion], other: list[Completion], tolerance: float = SPLIT_TOLERANCE) -> None:
    assert [o.output_ids for o in other] == [o.output_ids for o in one]
    for a, b in zip(one, other, strict=True):
        for x, y in zip(a.meta.output_logprobs, b.meta.output_logprobs, strict=True):
            assert [t for t, _ in x.top] == [t for t, _ in y.top]
            assert max(abs(p - q) for (_, p), (_, q) in zip(x.top, y.top, strict=True)) < tolerance


@pytest.fixture(scope="module")
def one_rank(tmp_path_factory):
    """name -> (its folder, its outputs and expert load on one rank): each family built and run once for the
    module."""
    root = tmp_path_factory.mktemp("ep")

    @functools.cache
    def folder_and_outputs(name: str) -> tuple[Path, list[Completion], torch.Tensor]:
        build(root, name)
        return root / name, *_run(root / name)

    return folder_and_outputs


@pytest.mark.parametrize("name, options", [
    ("mixtral", dict(tp_size=4)),  # 4 experts: one per rank; 2 KV heads replicated over 4 ranks
    ("qwen2-moe", dict(tp_size=2, ep_size=1)),  # --ep 1: each rank holds half of every expert's units
    ("deepseek-v3", dict(tp_size=2)),  # MLA: 2 of 4 query heads per rank over the same latent; 4 experts each
], ids=["ep4", "tp2-ep1", "deepseek-ep2"])
def test_ep_greedy_tokens_and_logprobs_match_ep1(one_rank, name, options):
    folder, one, _ = one_rank(name)
    _assert_same(one, _run(folder, **options)[0])


def test_experts_that_do_not_split_over_the_ranks_are_refused(tmp_path):
    build(tmp_path, "qwen3-moe")  # 6 experts
    with pytest.raises(Exception, match="ep_size 4"):
        Engine(str(tmp_path / "qwen3-moe"), device="cpu", kv_cache_tokens=256, tp_size=4)
    with pytest.raises(ValueError, match="ep_size must be 1 or tp_size"):
        Engine(str(tmp_path / "qwen3-moe"), device="cpu", kv_cache_tokens=256, tp_size=4, ep_size=2)


def test_ep2_and_eplb_under_ep_keep_ep1_outputs(one_rank):
    """EP 2 (4 experts + a shared expert, 2 per rank; layer 0 dense, tensor-parallel) gives EP 1's outputs;
    then a placement with replicas applied on both ranks (each gathers the experts its new physical slots
    run) keeps them."""
    folder, one, _ = one_rank("qwen2-moe")  # 4 experts -> 6 physical: 3 per rank, two replicas
    with Engine(str(folder), device="cpu", kv_cache_tokens=1024, max_prefill_tokens=64, tp_size=2) as engine:
        before = _generate(engine)
        with pytest.raises(ValueError, match="ep_size 2"):
            engine.rebalance_experts(num_physical=6, num_ranks=4)
        placements = engine.rebalance_experts(num_physical=6)
        after = _generate(engine)
        engine.check_invariants()
    assert all(p.num_ranks == 2 and sorted(set(p.phys_to_logical)) == [0, 1, 2, 3] for p in placements)
    _assert_same(one, before)
    _assert_same(one, after)


# ---- DP attention: each rank runs its own requests over its own pool; the experts stay EP over both ranks ----
DP = dict(tp_size=2, enable_dp_attention=True)
# DP ranks batch requests differently from one rank, and fp32 logprobs move with a batch's shape: on one rank,
# Mixtral's prompt run alone differs from the same prompt run in this batch by up to 1.7e-4
DP_TOLERANCE = 5e-4


def _together(engine: Engine, requests: list[tuple[list[int], dict]]) -> list[Completion]:
    """Each (prompt, sampling params) submitted in this order, all running at once."""
    async def run() -> list:
        return await asyncio.gather(*(engine.async_generate(input_ids=ids, sampling_params=params)
                                      for ids, params in requests))

    return asyncio.run(run())


def test_dp_attention_deepseek_matches_one_rank_with_half_the_latent_pool_per_rank(one_rank):
    """MLA under DP attention: each rank's latent pool holds half the tokens (a TP-attention rank holds the
    whole latent pool: the latent is not split by heads), and greedy tokens and logprobs equal one rank's."""
    folder, one, _ = one_rank("deepseek-v3")
    with Engine(str(folder), device="cpu", kv_cache_tokens=1024, max_prefill_tokens=64, **DP) as engine:
        out = _generate(engine)
        engine.check_invariants()
        ranks = engine.scheduler.ranks
        pool = ranks[0].kv.pool
        per_rank_bytes = sum(b.numel() * b.element_size() for b in pool.k_buffers)
        finished = [s.counters.finished for s in ranks]
    _assert_same(one, out, DP_TOLERANCE)
    assert all(n > 0 for n in finished), finished  # both ranks ran requests
    cfg = engine.runner.model.config
    token_bytes = KVPool.bytes_per_token(cfg.num_layers, 1, cfg.head_dim, torch.float32, shared_kv=True)
    assert [s.kv.num_slots for s in ranks] == [512, 512]
    assert per_rank_bytes == (512 + 1) * token_bytes  # + the pad slot; TP attention: (1024 + 1) on every rank


def test_dp_attention_mixtral_eplb_idle_rank_prefix_dispatch_abort_and_close(one_rank):
    """Under EPLB's placement (3 physical experts per rank): requests ending at different steps, one rank
    idling while the other decodes, a shared prefix dispatched to the rank that caches it, an abort, and a
    close with a request in flight."""
    folder, one, one_load = one_rank("mixtral")
    batch = prompts(7)
    with Engine(str(folder), device="cpu", kv_cache_tokens=1024, max_prefill_tokens=64, **DP) as engine:
        _assert_same(one, _generate(engine), DP_TOLERANCE)
        # each rank routes its own tokens: the engine's load sums them; EPLB's placement then moves weights on both
        assert engine.expert_load().sum() == one_load.sum() > 0
        engine.rebalance_experts(num_physical=6)
        # requests ending at different steps: the short one's rank idles (zero-token steps) while the other decodes
        uneven = _together(engine, [(batch[0], GREEDY), (batch[1], GREEDY | {"max_new_tokens": 3})])
        assert uneven[0].output_ids == one[0].output_ids and uneven[1].output_ids == one[1].output_ids[:3]
        # a shared prefix follows its KV: P + x ran on rank 0; with rank 0 busier, P + y still goes there
        shared = prompts(11)[0][:60]
        first = engine.generate(input_ids=shared + [1, 2], sampling_params=GREEDY)
        busy, second = _together(engine, [(batch[2] * 3, GREEDY | {"max_new_tokens": 20}), (shared + [3, 4], GREEDY)])
        assert second.meta.cached_tokens >= len(shared) > first.meta.cached_tokens
        # abort mid-decode and close with a request in flight: neither hangs, no slot leaks
        stream = engine.stream(input_ids=batch[1], sampling_params=GREEDY | {"max_new_tokens": 50})
        next(stream)
        stream.close()
        engine.check_invariants()
        assert engine.flush_cache()
        assert [s.kv.num_free_slots for s in engine.scheduler.ranks] == [512, 512]
        ended: list[StreamChunk] = []
        decoding = threading.Event()
        sub = engine.prepare(input_ids=batch[1], sampling_params=GREEDY | {"max_new_tokens": 100}).requests[0]
        engine.submit(sub, lambda chunk: (ended.append(chunk), decoding.set()))
        assert decoding.wait(60)
    assert ended[-1].finished and ended[-1].finish_reason == "abort"
