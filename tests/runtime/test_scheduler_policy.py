"""The scheduler is policy over requests and the KV owner: driven here with no model at all (a step's
forward is simulated by marking its KV computed), as nano-vllm's scheduler is tested."""
from __future__ import annotations

from collections import defaultdict

import pytest
import torch

from radixlang.runtime.batch import Finish
from radixlang.runtime.config import EngineConfig
from radixlang.runtime.engine import create_req
from radixlang.runtime.kv.kv_manager import KVManager
from radixlang.runtime.kv.memory import KVPool, ReqToToken, SlotAllocator
from radixlang.runtime.kv.radix_cache import RadixCache
from radixlang.runtime.namespace import DEFAULT_NAMESPACE
from radixlang.runtime.request import Req, ReqState
from radixlang.runtime.sampling_params import SamplingParams
from radixlang.runtime.scheduling.schedule_policy import STARVATION_STEPS
from radixlang.runtime.scheduling.scheduler import Scheduler
from radixlang.runtime.submission import Retention

CPU = torch.device("cpu")
CONTEXT = 64


@pytest.fixture
def make(tokenizer):
    chunks = defaultdict(list)

    def scheduler(pool: int = 128, **options) -> Scheduler:
        cfg = EngineConfig.from_options("unused", device="cpu", **options)
        allocator = SlotAllocator(pool, CPU)
        kv = KVManager(KVPool(pool, 1, 1, 4, torch.float32, CPU), allocator, ReqToToken(4, CONTEXT, CPU),
                       RadixCache(allocator.free, device=CPU))
        return Scheduler(cfg, kv, CONTEXT)

    def req(rid: str, n_prompt: int, max_new_tokens: int = 4) -> Req:
        params = SamplingParams(max_new_tokens=max_new_tokens, temperature=0)
        return create_req(rid, list(range(10, 10 + n_prompt)), params, tokenizer, chunks[rid].append,
                          context_length=CONTEXT, seed=0, device=CPU)

    return scheduler, req, chunks


def forward(sched: Scheduler, batch) -> None:
    """What the model step does to the KV owner: the scheduled positions now hold KV."""
    for item in batch.items:
        sched.kv.computed(item.req, item.end)


def test_nothing_to_schedule_gives_no_batch(make):
    scheduler, _, _ = make
    assert scheduler().schedule() is None


def test_a_prompt_over_the_prefill_budget_is_chunked_and_resumes_where_it_stopped(make):
    scheduler, req, _ = make
    sched = scheduler(max_prefill_tokens=8)
    r = req("a", 20)
    sched.add(r)
    first = sched.schedule()
    assert [(i.req.rid, i.start, i.length) for i in first.items] == [("a", 0, 8)]
    forward(sched, first)
    second = sched.schedule()
    assert [(i.start, i.length) for i in second.items] == [(8, 8)]
    sched.check_invariants()


def test_apply_ends_the_decided_requests_frees_their_kv_and_sends_the_last_chunk(make):
    scheduler, req, chunks = make
    sched = scheduler()
    a, b = req("a", 6), req("b", 5)
    sched.add(a)
    sched.add(b)
    batch = sched.schedule()
    assert {i.req.rid for i in batch.items} == {"a", "b"}
    forward(sched, batch)
    sched.apply([Finish(a, "stop", matched=2), Finish(b, "abort", error="gone")])
    assert a.done and b.done and not sched.has_work and sched.schedule() is None
    assert [(c[-1].finish_reason, c[-1].matched_stop, c[-1].error) for c in (chunks["a"], chunks["b"])] == [
        ("stop", 2, None), ("abort", None, "gone")]
    sched.check_invariants()
    assert sched.kv.num_free_slots + sched.kv.cached_tokens == sched.kv.num_slots


def finish_filled(sched: Scheduler, batch) -> None:
    """Simulates the step, then ends every request whose prompt is now computed (a one-token answer)."""
    forward(sched, batch)
    sched.apply([Finish(i.req, "length") for i in batch.items if i.end == len(i.req.prompt_ids)])


def test_least_prefill_admits_the_fewest_uncached_tokens_first(make):
    scheduler, req, _ = make
    sched = scheduler(pool=256, max_prefill_tokens=200)
    assert sched.cfg.schedule_policy == "least-prefill"  # the default
    sched.add(req("history", 30))
    finish_filled(sched, sched.schedule())  # tokens 10..39 now cached
    # oracle: tokens left to prefill = prompt - cached prefix (the cached path is 10..39 for "turn" only)
    long_cold, turn, short_cold = req("long-cold", 20), req("turn", 34), req("short-cold", 6)
    long_cold.prompt_ids = list(range(100, 120))  # 20 uncached
    short_cold.prompt_ids = list(range(200, 206))  # 6 uncached
    # "turn" repeats the cached 30 tokens and adds 4: 4 uncached
    for r in (long_cold, turn, short_cold):
        sched.add(r)
    assert [i.req.rid for i in sched.schedule().items] == ["turn", "short-cold", "long-cold"]
    sched.check_invariants()


def test_a_request_admission_found_no_room_for_is_not_overtaken_by_later_ones(make):
    scheduler, req, _ = make
    sched = tight(scheduler)
    running = one_shot(req, "running", range(100, 130), max_new_tokens=6)
    sched.add(running)
    decode(sched, sched.schedule())  # it holds 31 of the 64 slots for 5 more decodes
    big = one_shot(req, "big", range(200, 240), max_new_tokens=1)  # 40 slots: not before "running" ends
    sched.add(big)
    decode(sched, sched.schedule())
    assert big.state is ReqState.WAITING  # no room: admission found it blocked
    admitted: dict[str, int] = {}
    for step in range(12):
        small = one_shot(req, f"small{step}", range(300 + 10 * step, 306 + 10 * step), max_new_tokens=1)
        sched.add(small)  # 6 slots: each would fit in the 32 free ones, and is shorter than "big"
        batch = sched.schedule()
        for item in batch.items:
            admitted.setdefault(item.req.rid, step)
        decode(sched, batch)
        sched.check_invariants()
    # oracle: "running" decodes its last token in step 3 of the loop; "big" gets the slots it frees next
    # step, and no small request arriving after "big" was found blocked is admitted before it
    assert running.done and admitted["big"] == 4
    assert min(v for k, v in admitted.items() if k.startswith("small")) >= admitted["big"]
    assert big.done
    while sched.has_work:
        decode(sched, sched.schedule())
    sched.check_invariants()
    assert sched.kv.num_free_slots + sched.kv.cached_tokens == 64  # every slot free or cached: none leaked


def test_least_prefill_stops_overtaking_a_long_prompt_after_starvation_steps(make):
    scheduler, req, _ = make
    sched = scheduler(pool=256, max_prefill_tokens=8)
    long = req("long", 40)
    long.prompt_ids = list(range(100, 140))
    sched.add(long)
    admitted_at = None
    for step in range(STARVATION_STEPS + 4):
        # two fresh 4-token prompts a step take the whole 8-token budget, and each is shorter than "long"
        for k in range(2):
            short = req(f"s{step}-{k}", 4)
            short.prompt_ids = [300 + step * 2 + k] * 4
            sched.add(short)
        batch = sched.schedule()
        if admitted_at is None and any(i.req is long for i in batch.items):
            admitted_at = step
        finish_filled(sched, batch)
    assert admitted_at == STARVATION_STEPS  # queued at step 0, overtaken until it had waited that long
    sched.check_invariants()


# ---- classes: priority, then a session's turn over one-shot requests -------------------------------
def session(r: Req, key: str | None = None) -> Req:
    """`r` as a request of a prompt_cache_key session (it carries a retention owner)."""
    r.retain = Retention.session(key or r.rid)
    return r


def tight(scheduler) -> Scheduler:
    """A 64-slot pool and no reserve for future tokens: a request fits exactly when its slots are free."""
    return scheduler(pool=64, init_new_token_ratio=0.0, min_new_token_ratio=0.0)


def one_shot(req, rid: str, ids: range, max_new_tokens: int) -> Req:
    r = req(rid, len(ids), max_new_tokens=max_new_tokens)
    r.prompt_ids = list(ids)
    return r


def decode(sched: Scheduler, batch) -> None:
    """Simulates the step with a sampled token for every item that completes its sequence; then ends the
    requests that reached max_new_tokens, as the output processor would."""
    forward(sched, batch)
    done = []
    for item in batch.items:
        if item.samples:
            item.req.output_ids.append(7)
            if len(item.req.output_ids) == item.req.max_new_tokens:
                done.append(Finish(item.req, "length"))
    sched.apply(done)


def test_a_session_turn_is_admitted_before_queued_background_requests(make):
    scheduler, req, _ = make
    sched = scheduler(pool=256, max_prefill_tokens=30)
    # oracle: least-prefill alone would admit the two short one-shot prompts first (6 < 24 tokens each)
    bg1, bg2 = req("bg1", 6), req("bg2", 6)
    bg1.prompt_ids, bg2.prompt_ids = [300] * 6, [400] * 6
    turn = session(req("turn", 24))
    for r in (bg1, bg2, turn):
        sched.add(r)
    assert [i.req.rid for i in sched.schedule().items] == ["turn", "bg1"]  # bg2 is past the 30-token budget
    sched.check_invariants()


def test_a_larger_priority_goes_first_and_outranks_a_session(make):
    scheduler, req, _ = make
    sched = scheduler(pool=256, max_prefill_tokens=36)
    turn, low, urgent = session(req("turn", 6)), req("low", 6), req("urgent", 30)
    low.priority, urgent.priority = -1, 2  # SGLang's field: larger first
    low.prompt_ids, urgent.prompt_ids = [300] * 6, list(range(100, 130))
    for r in (low, turn, urgent):
        sched.add(r)
    assert [i.req.rid for i in sched.schedule().items] == ["urgent", "turn"]
    sched.check_invariants()


def test_a_session_turn_preempts_a_running_background_request_for_its_memory(make):
    scheduler, req, chunks = make
    sched = tight(scheduler)
    bg = one_shot(req, "bg", range(200, 230), max_new_tokens=20)
    sched.add(bg)
    decode(sched, sched.schedule())
    decode(sched, sched.schedule())  # bg decodes: it holds 31 of the 64 slots
    turn = session(req("turn", 40, max_new_tokens=4))  # 40 more slots: it fits only once bg's are free
    sched.add(turn)
    batch = sched.schedule()
    # oracle: the turn runs now, not after bg's 18 remaining decodes; bg is back in the queue, preempted once
    assert [(i.req.rid, i.length) for i in batch.items] == [("turn", 40)]
    assert bg.state is ReqState.PREEMPTED and bg.yielded
    assert sched.stats()["priority_preemptions_total"] == 1
    sched.check_invariants()
    decode(sched, batch)
    for _ in range(100):
        if not sched.has_work:
            break
        decode(sched, sched.schedule())
        sched.check_invariants()
    assert turn.done and bg.done
    assert [c.finish_reason for c in (chunks["turn"][-1], chunks["bg"][-1])] == ["length", "length"]
    assert len(bg.output_ids) == 20  # resumed where it stopped, and finished
    assert sched.stats()["priority_preemptions_total"] == 1
    sched.check_invariants()


def test_no_preemption_when_it_would_not_make_room(make):
    scheduler, req, _ = make
    sched = tight(scheduler)
    other, bg = session(req("other", 30, max_new_tokens=20)), one_shot(req, "bg", range(300, 310), 20)
    sched.add(other)
    sched.add(bg)
    decode(sched, sched.schedule())  # both run: 40 of the 64 slots
    turn = session(req("turn", 40))  # 40 slots: 24 free + bg's 10 is not enough, and "other" is its class
    turn.prompt_ids = list(range(100, 140))
    sched.add(turn)
    batch = sched.schedule()
    assert {i.req.rid for i in batch.items} == {"other", "bg"} and bg.state is ReqState.RUNNING
    assert sched.stats()["priority_preemptions_total"] == 0
    sched.check_invariants()


def test_background_work_is_delayed_never_starved_by_session_turns(make):
    scheduler, req, chunks = make
    sched = tight(scheduler)
    bg = one_shot(req, "bg", range(200, 220), max_new_tokens=24)
    sched.add(bg)
    ran, step = [], 0
    # a session turn that needs most of the pool arrives whenever the last one ends, forever
    while not bg.done and step < 6 * STARVATION_STEPS:
        if not any(r.retain is not None for r in sched.waiting + sched.running):
            turn = session(req(f"turn{step}", 40, max_new_tokens=4), "agent")
            turn.prompt_ids = [1000 + step] + list(range(101, 140))
            sched.add(turn)
        batch = sched.schedule()
        assert batch is not None, "nothing ran: a deadlock"
        if any(i.req is bg for i in batch.items):
            ran.append(step)
        decode(sched, batch)
        sched.check_invariants()
        step += 1
    # it yielded once, then waited at most STARVATION_STEPS steps to go ahead of every turn, and finished
    assert bg.done and chunks["bg"][-1].finish_reason == "length" and len(bg.output_ids) == 24
    assert max(b - a for a, b in zip(ran, ran[1:])) <= STARVATION_STEPS
    assert sched.stats()["priority_preemptions_total"] == 1


# ---- fairness across tenants (runtime/scheduling/fair_share.py) ------------------------------------
def tenant_req(req, rid: str, tenant: str, ids: range, max_new_tokens: int = 4) -> Req:
    r = one_shot(req, rid, ids, max_new_tokens)
    r.namespace = DEFAULT_NAMESPACE.child("tenant", tenant)
    return r


def service(reqs: list[Req]) -> int:
    """VTC's service (Sheng et al., wp=1, wq=2), from token counts alone: prompt tokens prefilled (kv_len
    within the prompt) plus twice the output tokens whose KV was computed."""
    return sum(min(r.kv_len, len(r.prompt_ids)) + 2 * max(0, r.kv_len - len(r.prompt_ids))
               if not r.done else len(r.prompt_ids) + 2 * (len(r.output_ids) - 1) for r in reqs)


@pytest.mark.parametrize("fair", [True, False])
def test_two_backlogged_tenants_receive_equal_service_within_one_request(make, fair):
    scheduler, req, _ = make
    sched = scheduler(pool=512, max_running_requests=2, disable_tenant_fairness=not fair)
    # the flooder queues 12 requests first; the light tenant's 6 arrive after them
    flood = [tenant_req(req, f"f{i}", "flood", range(1000 + 100 * i, 1016 + 100 * i)) for i in range(12)]
    light = [tenant_req(req, f"l{i}", "light", range(5000 + 100 * i, 5016 + 100 * i)) for i in range(6)]
    for r in flood + light:
        sched.add(r)
    gaps = []
    while any(not r.done for r in light):
        decode(sched, sched.schedule())
        gaps.append(abs(service(flood) - service(light)))
        sched.check_invariants()
    one_request = 16 + 2 * 4  # the most service one request receives
    if fair:  # VTC's bound for backlogged tenants: counters differ by at most about one request's worth
        assert max(gaps) <= 2 * one_request
        assert sum(r.done for r in flood) <= 7  # the light tenant finished without waiting for the flood
    else:  # the oracle's baseline: arrival order serves every flood request before the light tenant's
        assert all(r.done for r in flood) and max(gaps) >= 12 * 16
    while sched.has_work:
        decode(sched, sched.schedule())
    sched.check_invariants()


def prefills(batch) -> list[tuple[str, int]]:
    """(rid, tokens) of the batch's prefill chunks (items computing more than one position)."""
    return sorted((i.req.rid, i.length) for i in batch.items if i.length > 1)


def test_a_light_tenants_request_is_prefilled_whole_in_the_next_step_and_steps_stay_short(make):
    """A flooder's long prompts queue; another tenant's short request arrives: its whole prompt runs in the very
    next step with no flood prefill beside it, and while both tenants are active no step carries more than
    tenant_prefill_chunk tokens of the flood's prefill; once the light tenant is gone tenant_active_seconds,
    the flood has the whole budget back. (Before: the light request shared its step with half the budget of
    flood prefill, and the flood's steps stayed max_prefill_tokens long.)"""
    scheduler, req, _ = make
    sched = scheduler(pool=1024, max_prefill_tokens=48, tenant_prefill_chunk=8, tenant_active_seconds=10.0)
    now = [0.0]
    sched.clock = lambda: now[0]
    flood = [tenant_req(req, f"f{i}", "flood", range(1000 + 100 * i, 1040 + 100 * i), max_new_tokens=8)
             for i in range(4)]
    for r in flood:
        sched.add(r)
    first = sched.schedule()
    assert sum(n for _, n in prefills(first)) == 48  # one tenant: the whole budget
    decode(sched, first)
    light = tenant_req(req, "light", "light", range(5000, 5020), max_new_tokens=3)
    sched.add(light)
    batch = sched.schedule()
    assert prefills(batch) == [("light", 20)]  # whole, and alone among the prefills; the flood's decodes run
    assert all(i.length == 1 for i in batch.items if i.req is not light)
    decode(sched, batch)
    while not light.done:
        batch = sched.schedule()
        assert sum(n for rid, n in prefills(batch) if rid != "light") <= 8
        decode(sched, batch)
    now[0] = 9.0  # gone, but within tenant_active_seconds: it may be back any moment
    batch = sched.schedule()
    assert 0 < sum(n for _, n in prefills(batch)) <= 8
    decode(sched, batch)
    now[0] = 20.0  # gone for good: one tenant, the whole budget
    assert sum(n for _, n in prefills(sched.schedule())) == 48
    sched.check_invariants()


def test_a_step_kept_for_a_request_that_finds_no_room_runs_the_other_tenants_chunks(make):
    """The step kept for a light tenant's first request would be empty when that request finds no KV room:
    the flood's chunk runs instead (and the request, now known blocked, no longer holds steps back)."""
    scheduler, req, _ = make
    sched = scheduler(pool=48, max_prefill_tokens=32, tenant_prefill_chunk=32)
    big = tenant_req(req, "big", "flood", range(100, 140), max_new_tokens=1)
    sched.add(big)
    forward(sched, sched.schedule())  # 32 of its 40 tokens; 16 slots left
    sched.add(tenant_req(req, "light", "light", range(500, 530), max_new_tokens=1))  # needs 30
    batch = sched.schedule()
    assert batch is not None and [(i.req.rid, i.start, i.length) for i in batch.items] == [("big", 32, 8)]
    sched.check_invariants()


def test_a_flooder_whose_requests_all_ended_gets_chunks_not_its_prompts_whole(make):
    """A flooder's requests ended in one step and its next ones arrive together: it has nothing admitted, like
    a light tenant's new request, but it has many requests live: its prompts go in chunk-sized shares (else
    each cycle of its requests would make one long step for the others to wait on)."""
    scheduler, req, _ = make
    sched = scheduler(pool=1024, max_prefill_tokens=64, tenant_prefill_chunk=4)
    light = tenant_req(req, "light", "light", range(5000, 5010), max_new_tokens=20)
    sched.add(light)
    decode(sched, sched.schedule())  # the light tenant decodes
    for i in range(3):
        sched.add(tenant_req(req, f"f{i}", "flood", range(1000 + 100 * i, 1020 + 100 * i)))
    assert prefills(sched.schedule()) == [("f0", 4)]


def test_priority_orders_a_tenants_own_requests_not_other_tenants(make):
    scheduler, req, _ = make
    sched = scheduler(pool=512, max_prefill_tokens=16)
    served = tenant_req(req, "served", "a", range(100, 116), max_new_tokens=1)
    sched.add(served)
    decode(sched, sched.schedule())  # tenant a has received 16 tokens of service, b none
    urgent, low, b = (tenant_req(req, "urgent", "a", range(200, 216)), tenant_req(req, "low", "a", range(300, 316)),
                      tenant_req(req, "b", "b", range(400, 416)))
    urgent.priority = 5
    for r in (b, low, urgent):  # b first: arriving after a's, b would be lifted to a's counter (a tie)
        sched.add(r)
    # oracle: VTC picks the least-served tenant (b); within a, priority picks "urgent" over "low"
    assert [r.rid for r in sched._order_waiting()] == ["b", "urgent", "low"]
