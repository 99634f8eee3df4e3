"""RadixCache against a brute-force model: a dict from every cached prefix to its last token's slot."""
from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixlang.runtime.kv.radix_cache import RadixCache

keys = st.lists(st.integers(0, 3), min_size=1, max_size=10)


def longest_cached(model: dict[tuple, int], key: list[int]) -> int:
    n = 0
    while n < len(key) and tuple(key[: n + 1]) in model:
        n += 1
    return n


class RadixCacheMachine(RuleBasedStateMachine):
    @initialize()
    def setup(self) -> None:
        self.freed: list[int] = []
        self.cache = RadixCache(lambda slots: self.freed.extend(slots.tolist()))
        self.model: dict[tuple, int] = {}
        self.locks: list[tuple] = []  # (node, key prefix it covers)
        self.next_slot = 0

    def fresh_slots(self, n: int) -> torch.Tensor:
        slots = torch.arange(self.next_slot, self.next_slot + n)
        self.next_slot += n
        return slots

    @rule(key=keys)
    def insert(self, key: list[int]) -> None:
        expected = longest_cached(self.model, key)
        slots = self.fresh_slots(len(key))
        assert self.cache.insert(key, slots) == expected
        for j in range(expected + 1, len(key) + 1):
            self.model[tuple(key[:j])] = int(slots[j - 1])

    @rule(key=keys)
    def match(self, key: list[int]) -> None:
        n = longest_cached(self.model, key)
        m = self.cache.match_prefix(key)
        assert m.length == n
        assert m.slots.tolist() == [self.model[tuple(key[:j])] for j in range(1, n + 1)]

    @rule(key=keys)
    def lock(self, key: list[int]) -> None:
        m = self.cache.match_prefix(key)
        self.cache.inc_lock_ref(m.node)
        self.locks.append((m.node, tuple(key[: m.length])))

    @precondition(lambda self: self.locks)
    @rule(i=st.integers(0, 100))
    def unlock(self, i: int) -> None:
        node, _ = self.locks.pop(i % len(self.locks))
        self.cache.dec_lock_ref(node)

    @rule(n=st.integers(0, 12))
    def evict(self, n: int) -> None:
        protected = self.protected_prefixes()
        evictable_before = len(self.model) - len(protected)
        self.freed.clear()
        freed_count = self.cache.evict(n)
        assert freed_count == len(self.freed)
        assert freed_count >= min(n, evictable_before)
        by_slot = {slot: prefix for prefix, slot in self.model.items()}
        for slot in self.freed:
            prefix = by_slot[slot]
            assert prefix not in protected, "evicted a locked prefix"
            del self.model[prefix]
        for prefix in self.model:  # what remains is still prefix-closed
            assert len(prefix) == 1 or prefix[:-1] in self.model

    def protected_prefixes(self) -> set[tuple]:
        return {key[:j] for _, key in self.locks for j in range(1, len(key) + 1)}

    @invariant()
    def sizes_match_model(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check()
        assert self.cache.total_size == len(self.model)
        assert self.cache.protected_size == len(self.protected_prefixes())
        assert sorted(self.cache.all_slots().tolist()) == sorted(self.model.values())


TestRadixCacheAgainstBruteForce = RadixCacheMachine.TestCase
TestRadixCacheAgainstBruteForce.settings = settings(max_examples=150, stateful_step_count=40, deadline=None)


def test_evict_takes_least_recently_used_leaf_first():
    freed: list[int] = []
    cache = RadixCache(lambda s: freed.extend(s.tolist()))
    cache.insert([1, 2, 3], torch.tensor([10, 11, 12]))
    cache.insert([5, 6], torch.tensor([20, 21]))
    cache.match_prefix([1, 2, 3])  # touch the first: the second is now least recent
    cache.evict(1)
    assert freed == [20, 21]
    assert cache.match_prefix([1, 2, 3]).length == 3


def test_match_splits_edge_so_lock_covers_exactly_the_match():
    cache = RadixCache(lambda s: None)
    cache.insert([1, 2, 3, 4], torch.tensor([0, 1, 2, 3]))
    m = cache.match_prefix([1, 2, 9])
    assert m.length == 2 and m.node.key == [1, 2]
    cache.inc_lock_ref(m.node)
    assert (cache.protected_size, cache.evictable_size) == (2, 2)
    cache.evict(10)
    assert cache.match_prefix([1, 2, 3, 4]).length == 2  # the unlocked tail went, the locked head stayed
    cache.dec_lock_ref(m.node)
    cache.check()


def test_disabled_cache_matches_and_stores_nothing():
    cache = RadixCache(lambda s: None, disable=True)
    assert cache.insert([1, 2], torch.tensor([0, 1])) == 0
    assert cache.match_prefix([1, 2]).length == 0
    assert cache.total_size == 0
