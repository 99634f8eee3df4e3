"""DP attention's dispatcher, over real schedulers and KV owners with no model (as test_scheduler_policy):
a request goes to the rank holding the longest prefix of its prompt, unless that saves little or that rank
is much busier; otherwise to the least-loaded rank."""
from __future__ import annotations

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from radixlang.runtime.batch import Finish
from radixlang.runtime.config import DP_DISPATCH_SLACK, EngineConfig
from radixlang.runtime.engine import Engine, create_req
from radixlang.runtime.kv.kv_manager import KVManager
from radixlang.runtime.kv.memory import KVPool, ReqToToken, SlotAllocator
from radixlang.runtime.kv.radix_cache import RadixCache
from radixlang.runtime.request import Req
from radixlang.runtime.sampling_params import SamplingParams
from radixlang.runtime.scheduling.dp_scheduler import DPScheduler, common_prefix_len
from radixlang.runtime.scheduling.scheduler import Scheduler

CPU = torch.device("cpu")
CONTEXT = 128
PREFIX = list(range(100, 140))  # 40 tokens: more than DP_DISPATCH_MIN_PREFIX


@pytest.fixture
def dp(tokenizer):
    def scheduler() -> Scheduler:
        cfg = EngineConfig.from_options("unused", device="cpu", max_running_requests=16)
        allocator = SlotAllocator(512, CPU)
        kv = KVManager(KVPool(512, 1, 1, 4, torch.float32, CPU), allocator, ReqToToken(16, CONTEXT, CPU),
                       RadixCache(allocator.free, device=CPU))
        return Scheduler(cfg, kv, CONTEXT)

    def req(rid: str, prompt: list[int]) -> Req:
        return create_req(rid, prompt, SamplingParams(max_new_tokens=4, temperature=0), tokenizer, lambda c: None,
                          context_length=CONTEXT, seed=0, device=CPU)

    return DPScheduler([scheduler(), scheduler()]), req


def _rank(dps: DPScheduler, r: Req) -> int:
    return next(i for i, s in enumerate(dps.ranks) if r in s.waiting or r in s.running)


def test_a_prompt_sharing_a_queued_prompts_prefix_joins_its_rank_though_the_other_is_idle(dp):
    dps, req = dp
    first, sharer, short, other = (req("a", PREFIX + [1]), req("b", PREFIX + [2]), req("c", PREFIX[:3] + [9]),
                                   req("d", [7, 8, 9]))
    for r in (first, sharer, short, other):
        dps.add(r)
    # the sharer follows the first (rank 0, though idle rank 1 is less loaded); a 3-token share does not
    # outweigh load, so the short one and the unrelated one balance onto rank 1
    assert [_rank(dps, r) for r in (first, sharer, short, other)] == [0, 0, 1, 1]


def test_a_cached_prefix_draws_its_prompt_until_that_rank_is_too_busy(dp):
    dps, req = dp
    done = req("done", PREFIX + [1])
    dps.add(done)
    sched = dps.ranks[0]
    batch = sched.schedule()
    for item in batch.items:  # the step's forward: its KV is computed; then the request ends, cached
        sched.kv.computed(item.req, item.end)
    sched.apply([Finish(done, "length")])
    assert sched.kv.cached_prefix_len(PREFIX + [5]) >= len(PREFIX)
    placed = []
    for i in range(DP_DISPATCH_SLACK + 2):
        r = req(f"p{i}", PREFIX + [10 + i])
        dps.add(r)
        placed.append(_rank(dps, r))
    # rank 0 takes the sharers while it has at most DP_DISPATCH_SLACK more queued than rank 1, then rank 1
    assert placed == [0] * (DP_DISPATCH_SLACK + 1) + [1]
    dps.check_invariants()


def test_an_id_in_use_on_any_rank_is_refused_there(dp, tokenizer):
    dps, req = dp
    dps.add(req("x", [1, 2, 3]))
    ended = []
    dup = create_req("x", [4, 5, 6], SamplingParams(max_new_tokens=4), tokenizer, ended.append,
                     context_length=CONTEXT, seed=0, device=CPU)
    dps.add(dup)
    assert ended[-1].finish_reason == "abort" and "already in use" in ended[-1].error
    assert dps.abort("x") and not dps.has_work


@given(st.lists(st.integers(0, 3), max_size=12), st.lists(st.integers(0, 3), max_size=12))
def test_common_prefix_len_matches_a_token_by_token_count(a, b):
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    assert common_prefix_len(a, b) == n


@pytest.mark.parametrize("options, message", [
    (dict(tp_size=1), "tp_size >= 2"),
    (dict(tp_size=2, ep_size=1), "ep_size must be"),
    (dict(tp_size=2, speculative_algorithm="NGRAM"), "speculative decoding"),
])
def test_dp_attention_refuses_what_it_cannot_run(options, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig.from_options("unused", device="cpu", enable_dp_attention=True, **options)


def test_dp_attention_refuses_a_dense_model_before_loading_it():
    with pytest.raises(ValueError, match="needs a mixture-of-experts language model"):
        Engine(device="cpu", tp_size=2, enable_dp_attention=True)  # the default model: dense SmolLM2
