"""Pins on the radix cache (runtime/kv/pins.py) and the host tier (runtime/kv/host_tier.py) through the KV owner:
a hypothesis state machine of live requests, pins, unpins, TTL expiry, memory pressure, host parking and
restores, with the KV invariant of both tiers after every step, the eviction order and the pinned budget
checked against what the step did, and every cached slot's KV checked against the token it holds."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixlang.runtime.kv.kv_manager import KVManager
from radixlang.runtime.kv.memory import KVPool, ReqToToken, SlotAllocator
from radixlang.runtime.kv.radix_cache import RadixCache
from radixlang.runtime.namespace import DEFAULT_NAMESPACE
from radixlang.runtime.request import KVFields

POOL = 48
keys = st.lists(st.integers(0, 3), min_size=1, max_size=12)
owners = st.sampled_from(["a", "b", "c", "d", "e"])


@dataclass(eq=False)
class FakeReq(KVFields):
    """What the KV owner reads of a request: its token ids."""

    rid: str
    ids: list[int]

    @property
    def fill_len(self) -> int:
        return len(self.ids)

    def tokens(self, start: int, end: int) -> list[int]:
        return self.ids[start:end]


def make_kv(pool: int = POOL, fraction: float = 0.5, host: int = 0) -> KVManager:
    cpu = torch.device("cpu")
    allocator = SlotAllocator(pool, cpu)
    return KVManager(KVPool(pool, 1, 1, 1, torch.float32, cpu), allocator, ReqToToken(8, 64, cpu),
                     RadixCache(allocator.free), max_pinned_fraction=fraction, host_tokens=host, min_restore=1)


def run_request(kv: KVManager, ids: list[int], rid: str = "r") -> FakeReq | None:
    """Admits `ids` and computes all of it, as a prefill would (a token's K is the token id, its V minus
    it: what the cached KV must still say wherever it moves); None if it does not fit."""
    req = FakeReq(rid=rid, ids=ids)
    n = kv.admit(req, len(ids), len(ids), lambda n: kv.can_fit(n, 0, True))
    if n is None:
        return None
    first = kv.extend(req, n)
    slots = kv.req_to_token.read(req.row, first, first + n)
    computed = torch.tensor(ids[first:first + n], dtype=torch.float32).view(-1, 1, 1)
    kv.pool.k_buffers[0][slots] = computed
    kv.pool.v_buffers[0][slots] = -computed
    kv.computed(req, req.slot_len)
    kv.commit(req)
    return req


def check_kv_contents(kv: KVManager) -> None:
    """Every cached slot, in either tier, holds the KV of its token."""
    tiers = [(kv.cache, kv.pool.k_buffers[0], kv.pool.v_buffers[0])]
    if kv.host is not None:
        tiers.append((kv.host.cache, kv.host.groups[0][0], kv.host.groups[1][0]))
    for cache, k, v in tiers:
        for node in cache.nodes():
            want = torch.tensor(node.key, dtype=torch.float32)
            assert torch.equal(k[node.value].flatten(), want) and torch.equal(v[node.value].flatten(), -want)


def tree_slots_unlocked(kv: KVManager, wanted: bool) -> set[int]:
    """Slots of unlocked tree nodes a queued request will hit (`wanted`) or will not."""
    return {s for node in kv.cache.nodes() if node.lock_ref == 0 and bool(node.want_ref) == wanted
            for s in node.value.tolist()}


class PinMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.kv = make_kv(host=64)
        self.now = 0.0
        self.kv.pins.clock = lambda: self.now
        self.running: list[FakeReq] = []
        self.waiting: list[FakeReq] = []

    @precondition(lambda self: len(self.running) < 8)
    @rule(ids=keys)
    def start_request(self, ids: list[int]) -> None:
        req = run_request(self.kv, ids, rid=str(len(self.running)))
        if req is not None:
            self.running.append(req)

    @precondition(lambda self: self.running)
    @rule(i=st.integers(0, 7), owner=owners, ttl=st.sampled_from([None, 1.0, 5.0]), keep=st.booleans())
    def finish_request(self, i: int, owner: str, ttl: float | None, keep: bool) -> None:
        """A finished request; `keep`: its sequence stays pinned for `owner`, as a keyed session's does."""
        req = self.running.pop(i % len(self.running))
        ids = req.tokens(0, req.kv_len)
        self.kv.release(req)
        if keep:
            pinned = self.kv.pin(owner, ids, ttl)
            assert pinned in (0, len(ids))
            assert (pinned > 0) == (owner in self.kv.pins.pins)

    @rule(owner=owners, ids=keys, ttl=st.sampled_from([None, 1.0, 5.0]))
    def pin_cached_prefix(self, owner: str, ids: list[int], ttl: float | None) -> None:
        cached = self.kv.cached_prefix_len(ids)
        pinned = self.kv.pin(owner, ids, ttl)
        assert pinned == 0 or pinned == cached

    @rule(owner=owners)
    def unpin(self, owner: str) -> None:
        had = owner in self.kv.pins.pins
        assert (self.kv.pins.unpin(owner) > 0) == had
        assert owner not in self.kv.pins.pins

    @rule(dt=st.sampled_from([0.5, 2.0, 6.0]))
    def time_passes(self, dt: float) -> None:
        self.now += dt
        self.kv.pins.expire()
        assert all(p.expires > self.now for p in self.kv.pins.pins.values()), "an expired pin survived"

    @precondition(lambda self: len(self.waiting) < 4)
    @rule(ids=keys)
    def queue_request(self, ids: list[int]) -> None:
        """A request arrives and waits: the cached prefix it will hit is evicted last."""
        req = FakeReq(rid=f"q{len(self.waiting)}", ids=ids)
        self.kv.want(req)
        assert self.kv.cache.path_key(req.wanted) == ids[:self.kv.cached_prefix_len(ids)]
        self.waiting.append(req)

    @precondition(lambda self: self.waiting)
    @rule(i=st.integers(0, 3), admit=st.booleans())
    def dequeue_request(self, i: int, admit: bool) -> None:
        """A queued request is admitted (if it fits) or aborted: either way it wants nothing any more."""
        req = self.waiting.pop(i % len(self.waiting))
        if admit and len(self.running) < 8:
            ran = run_request(self.kv, req.ids, rid=req.rid)
            self.kv.release(req)  # the queued copy, never admitted itself: drops its want alone
            if ran is not None:
                self.running.append(ran)
        else:
            self.kv.release(req)
        assert req.wanted is None and req.row is None

    @rule(n=st.integers(1, POOL))
    def memory_pressure(self, n: int) -> None:
        """ensure_free frees unpinned LRU leaves no queued request will hit first, then expired pins, then
        idle pins oldest first, then what queued requests will hit."""
        before = dict(self.kv.pins.pins)
        unwanted, wanted = tree_slots_unlocked(self.kv, False), tree_slots_unlocked(self.kv, True)
        wanted_pinned = {s for p in before.values() if p.node.want_ref for s in self.kv.cache.path_slots(p.node).tolist()}
        ok = self.kv.ensure_free(n)
        released = [p for owner, p in before.items() if self.kv.pins.pins.get(owner) is not p]
        in_tree = set(self.kv.cache.all_slots().tolist())
        if released:
            assert not unwanted & in_tree, "a pin was released while unpinned leaves were left"
        if (wanted | wanted_pinned) - in_tree:
            assert not unwanted & in_tree, "a queued request's hit went before an unwanted leaf"
            assert not any(p.node.lock_ref == p.node.pin_ref and not p.node.want_ref
                           for p in self.kv.pins.pins.values()), "a queued request's hit went before an idle pin"
        if any(p.expires > self.now for p in released):
            assert not any(p.expires <= self.now for p in self.kv.pins.pins.values()), \
                "a live pin was released before an expired one"
        kept_ages = [p.touched for p in self.kv.pins.pins.values()
                     if p.node.lock_ref == p.node.pin_ref and not p.node.want_ref]
        for p in released:
            assert all(p.touched <= age for age in kept_ages) or p.node.want_ref, \
                "a younger idle pin went before an older one"
        if not ok:
            assert self.kv.cache.evictable_size == 0 and self.kv.pins.releasable == 0

    @invariant()
    def every_slot_is_free_cached_pinned_or_held(self) -> None:
        if not hasattr(self, "kv"):
            return
        self.kv.check(self.running, self.waiting)
        assert self.kv.cache.pinned_size <= self.kv.pins.budget
        check_kv_contents(self.kv)

    @rule(ids=keys)
    def host_restore_matches_what_was_parked(self, ids: list[int]) -> None:
        """A prompt admitted now reuses the device match plus what the host tier held beyond it."""
        if len(self.running) >= 8:
            return
        on_device, hosted = self.kv.cached_prefix_len(ids), self.kv.host.match(ids).length
        restored = self.kv.host.restored_tokens
        req = run_request(self.kv, ids, rid=f"h{len(self.running)}")
        if self.kv.host.restored_tokens > restored:
            assert self.kv.host.restored_tokens - restored == hosted - on_device, "a restore reaches the host's match"
        if req is not None:
            self.running.append(req)


TestPinsStateMachine = PinMachine.TestCase
TestPinsStateMachine.settings = settings(max_examples=120, stateful_step_count=40, deadline=None)


def test_pins_survive_pressure_that_evicts_everything_else():
    kv = make_kv()
    kept = [1, 2, 3, 0, 1, 2, 3, 0, 1, 2]
    kv.release(run_request(kv, kept))
    assert kv.pin("session", kept, None) == len(kept)
    for k in range(3):  # unpinned sequences that fill the rest of the pool
        kv.release(run_request(kv, [k + 5] * 12))
    assert kv.ensure_free(POOL - len(kept))  # everything unpinned goes, the pin stays
    assert kv.cache.total_size == len(kept) and kv.cached_prefix_len(kept) == len(kept)
    assert kv.pins.stats.released_under_pressure == 0
    kv.check([], [])


def test_a_queued_request_keeps_its_hit_under_pressure():
    """Eviction order: unpinned LRU leaves, expired pins, idle pins by age, and only then what a queued
    request will hit, though that was used longest ago."""
    kv = make_kv(fraction=0.5)
    now = [0.0]
    kv.pins.clock = lambda: now[0]
    queued_prefix, pinned, lru = [1] * 12, [2] * 12, [3] * 12
    for ids in (queued_prefix, pinned, lru):  # queued_prefix is the least recently used
        kv.release(run_request(kv, ids))
    kv.pin("expired", pinned[:6], ttl=1.0)
    kv.pin("idle", pinned, ttl=None)
    now[0] = 2.0
    queued = FakeReq(rid="queued", ids=queued_prefix + [5, 6])
    kv.want(queued)
    kv.check([], [queued])
    assert kv.ensure_free(POOL - len(queued_prefix))  # all but the queued request's prefix must go
    assert kv.cached_prefix_len(queued.ids) == len(queued_prefix) and kv.cache.total_size == len(queued_prefix)
    assert kv.pins.pins == {} and kv.pins.stats.expired == 1 and kv.pins.stats.released_under_pressure == 1
    kv.check([], [queued])
    assert kv.ensure_free(POOL)  # and it still goes when nothing else is left: a want is no lock
    assert kv.cache.total_size == 0
    kv.check([], [queued])
    kv.release(queued)
    kv.check([], [])


def test_admission_releases_an_idle_pin_rather_than_wait():
    kv = make_kv(fraction=1.0)
    kv.release(run_request(kv, list(range(40))))
    kv.pin("old", list(range(40)), None)
    assert kv.can_fit(POOL, 0, waive_reserve=False)  # the pin's 40 tokens count as room
    assert kv.pins.pins == {} and kv.pins.stats.released_under_pressure == 1
    kv.check([], [])


def test_a_pin_in_use_by_a_live_request_is_kept_under_pressure():
    kv = make_kv(fraction=1.0)
    ids = list(range(20))
    kv.release(run_request(kv, ids))
    kv.pin("s", ids, None)
    req = run_request(kv, ids + [99])  # the session's next turn runs on its pinned prefix
    assert not kv.ensure_free(POOL)  # releasing the pin would free nothing: it stays
    assert "s" in kv.pins.pins
    kv.check([req], [])
    kv.release(req)


def test_pinned_budget_releases_the_oldest_pin_first():
    kv = make_kv(fraction=0.5)  # 24 tokens
    now = [0.0]
    kv.pins.clock = lambda: now[0]
    for i, owner in enumerate("abc"):
        ids = [i + 4] * 10
        kv.release(run_request(kv, ids))
        now[0] += 1
        kv.pin(owner, ids, None)
        assert kv.cache.pinned_size <= 24
    assert sorted(kv.pins.pins) == ["b", "c"]  # a, the oldest, made room for c
    assert kv.pin("big", list(range(30)), None) == 0  # a pin over the whole budget is refused
    kv.check([], [])


def test_ttl_expiry_frees_the_path_to_the_lru():
    kv = make_kv()
    now = [0.0]
    kv.pins.clock = lambda: now[0]
    ids = [1, 2, 3, 4]
    kv.release(run_request(kv, ids))
    kv.pin("s", ids, ttl=2.0)
    assert kv.cache.evictable_size == 0
    now[0] = 1.0
    assert kv.pins.expire() == 0
    now[0] = 2.5
    assert kv.pins.expire() == 1 and kv.cache.evictable_size == len(ids) and kv.cache.pinned_size == 0
    kv.check([], [])


def test_a_pin_released_for_the_budget_goes_to_the_young_end_of_the_lru():
    kv = make_kv(fraction=0.25)  # 12 tokens
    session, one_shot = [1] * 10, [7] * 10
    kv.release(run_request(kv, session))
    kv.pin("old", session, None)
    kv.release(run_request(kv, one_shot))  # used after the session's last turn, never pinned
    kv.release(run_request(kv, [2] * 10))
    kv.pin("new", [2] * 10, None)  # over the budget: "old" goes
    assert list(kv.pins.pins) == ["new"]
    assert kv.ensure_free(kv.allocator.num_free + 10)  # one 10-token path must go: the one-shot, not the session
    assert kv.cached_prefix_len(session) == 10 and kv.cached_prefix_len(one_shot) == 0
    kv.check([], [])


def test_the_pinned_budget_keeps_a_forked_parent_under_its_sub_agents():
    kv = make_kv(fraction=0.5)  # 24 tokens
    now = [0.0]
    kv.pins.clock = lambda: now[0]
    parent, sub = [1] * 12, [1] * 12 + [3] * 4
    kv.release(run_request(kv, sub))
    kv.pin("parent", parent, None)
    now[0] = 1.0
    kv.pin("sub", sub, None)  # the sub-agent extends the parent's pinned history: 16 tokens pinned
    now[0] = 2.0
    kv.release(run_request(kv, [5] * 10))
    kv.pin("other", [5] * 10, None)  # 26 > 24: releasing the parent would free nothing, so "sub" goes
    assert sorted(kv.pins.pins) == ["other", "parent"] and kv.cache.pinned_size == 22
    kv.check([], [])


def test_with_a_host_tier_admission_releases_an_idle_pin_instead_of_waiting_for_live_requests():
    for host, admitted in ((0, False), (POOL, True)):
        kv = make_kv(fraction=1.0, host=host)
        kv.release(run_request(kv, list(range(20))))
        kv.pin("idle", list(range(20)), None)
        live = run_request(kv, list(range(100, 124)), "live")  # 24 slots, back once it finishes
        # 4 free + 20 pinned: the request fits only by releasing the pin, or after "live" finishes
        assert kv.can_fit(20, 0, waive_reserve=False) is admitted
        assert ("idle" in kv.pins.pins) is not admitted
        if admitted:  # the released pin's KV parked in the host tier, where its owner finds it
            assert kv.host is not None and kv.host.match(list(range(20))).length == 20
        kv.check([live], [])


def test_a_host_restore_releases_idle_pins_as_a_recompute_would():
    kv = make_kv(fraction=1.0, host=POOL)
    session = list(range(30))
    kv.release(run_request(kv, session))
    kv.ensure_free(POOL)  # the session's KV is evicted to the host tier
    kv.release(run_request(kv, list(range(100, 130))))
    kv.pin("other", list(range(100, 130)), None)  # an idle pin holds 30 of the 48 slots
    back = run_request(kv, session + [7], "back")  # the session's next turn
    assert back is not None and kv.host is not None
    assert kv.host.restored_tokens == 30 and kv.pins.pins == {}  # copied back, not recomputed
    check_kv_contents(kv)
    kv.check([back], [])


def test_a_host_restore_that_does_not_fit_whole_copies_back_the_first_chunk():
    kv = make_kv(host=POOL)
    session = list(range(40))
    kv.release(run_request(kv, session))
    kv.ensure_free(POOL)  # the session's KV is evicted to the host tier
    live = run_request(kv, list(range(100, 116)), "live")  # 16 of 48 slots held: 40 do not fit, 16 + 16 do
    back = FakeReq(rid="back", ids=session + [7])
    assert kv.admit(back, 40, 16, lambda n: kv.can_fit(n, 0, False)) == 16  # the next 16 are recomputed
    assert kv.host is not None and kv.host.restored_tokens == 16 and back.cached_len == 16
    check_kv_contents(kv)  # the copied chunk holds its tokens' KV
    kv.check([live, back], [])


def test_a_tenants_pins_past_its_share_release_its_own_oldest_never_another_tenants():
    alice, bob = DEFAULT_NAMESPACE.child("tenant", "alice"), DEFAULT_NAMESPACE.child("tenant", "bob")
    for share, kept in ((0, ["a1", "a2", "a3"]), (16, ["a2", "a3", "bob"])):
        kv = make_kv(fraction=0.5)  # 24 tokens under pins at most
        kv.pins.tenant_budget = share
        now = [0.0]
        kv.pins.clock = lambda: now[0]
        for owner, ns, token in (("bob", bob, 9), ("a1", alice, 1), ("a2", alice, 2), ("a3", alice, 3)):
            ids = [token] * 8
            req = FakeReq(rid=owner, ids=ids, namespace=ns)
            n = kv.admit(req, 8, 8, lambda n: kv.can_fit(n, 0, True))
            assert n == 8
            kv.extend(req, n)
            kv.computed(req, req.slot_len)
            kv.release(req)
            kv.pin(owner, ids, None, namespace=ns)
            now[0] += 1
        # oracle: without a share, alice's third session needs 32 > 24 pinned tokens and the oldest pin,
        # bob's, goes; with a 16-token share alice's own oldest (a1) goes and bob's pin stays
        assert sorted(kv.pins.pins) == kept
        assert kv.pins.account_size(alice) <= (share or 24)
        kv.check([], [])
