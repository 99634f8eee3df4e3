"""RadixCache against a brute-force model: a dict from every cached (namespace, prefix) to its last token's
slot; a prefix is reused only within its namespace."""
from __future__ import annotations

import torch
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from radixlang.runtime.kv.radix_cache import RadixCache
from radixlang.runtime.namespace import DEFAULT_NAMESPACE, Namespace

keys = st.lists(st.integers(0, 3), min_size=1, max_size=10)
TENANT_A = DEFAULT_NAMESPACE.child("tenant", "a")
namespaces = st.sampled_from([DEFAULT_NAMESPACE, TENANT_A, TENANT_A.child("adapter", "x")])


def longest_cached(model: dict[tuple, int], key: list[int], ns: Namespace = DEFAULT_NAMESPACE) -> int:
    n = 0
    while n < len(key) and (ns, *key[: n + 1]) in model:
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

    @rule(key=keys, ns=namespaces)
    def insert(self, key: list[int], ns: Namespace) -> None:
        expected = longest_cached(self.model, key, ns)
        slots = self.fresh_slots(len(key))
        assert self.cache.insert(key, slots, ns) == expected
        for j in range(expected + 1, len(key) + 1):
            self.model[(ns, *key[:j])] = int(slots[j - 1])

    @rule(key=keys, ns=namespaces)
    def match(self, key: list[int], ns: Namespace) -> None:
        n = longest_cached(self.model, key, ns)
        m = self.cache.match_prefix(key, ns)
        assert m.length == n
        assert m.slots.tolist() == [self.model[(ns, *key[:j])] for j in range(1, n + 1)]
        assert self.cache.namespace_of(m.node) == ns

    @rule(key=keys, ns=namespaces)
    def lock(self, key: list[int], ns: Namespace) -> None:
        m = self.cache.match_prefix(key, ns)
        self.cache.inc_lock_ref(m.node)
        self.locks.append((m.node, (ns, *key[: m.length])))

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
            assert len(prefix) == 2 or prefix[:-1] in self.model

    def protected_prefixes(self) -> set[tuple]:
        return {key[:j] for _, key in self.locks for j in range(2, len(key) + 1)}

    @invariant()
    def sizes_match_model(self) -> None:
        if not hasattr(self, "cache"):
            return
        self.cache.check()
        assert self.cache.total_size == len(self.model)
        assert self.cache.protected_size == len(self.protected_prefixes())
        assert sorted(self.cache.all_slots().tolist()) == sorted(self.model.values())
        # a namespace has a root exactly while it holds a path (the default one always)
        assert set(self.cache.namespaces) == {DEFAULT_NAMESPACE} | {prefix[0] for prefix in self.model}


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


def test_namespaces_share_no_prefix_and_evict_by_one_lru():
    """Two tenants with the same tokens hold two paths; a flush (evict all) empties both."""
    freed: list[int] = []
    cache = RadixCache(lambda s: freed.extend(s.tolist()))
    b = DEFAULT_NAMESPACE.child("tenant", "b")
    assert cache.insert([1, 2, 3], torch.tensor([0, 1, 2]), TENANT_A) == 0
    assert cache.match_prefix([1, 2, 3]).length == 0  # the default namespace sees nothing of A's
    assert cache.match_prefix([1, 2, 3], b).length == 0
    assert cache.insert([1, 2, 3], torch.tensor([3, 4, 5]), b) == 0  # B computes its own copy
    assert cache.match_prefix([1, 2, 3], TENANT_A).slots.tolist() == [0, 1, 2]
    assert cache.match_prefix([1, 2, 3], b).slots.tolist() == [3, 4, 5]
    assert set(cache.namespaces) == {DEFAULT_NAMESPACE, TENANT_A, b}
    cache.check()
    assert cache.evict(100) == 6 and sorted(freed) == [0, 1, 2, 3, 4, 5]
    assert cache.namespaces == [DEFAULT_NAMESPACE]
    cache.check()


def test_a_shared_prefix_is_one_path_and_what_follows_it_stays_each_namespaces_own():
    from radixlang.runtime.kv.shared_prefix import SharedPrefixes

    a, b = DEFAULT_NAMESPACE.child("tenant", "a"), DEFAULT_NAMESPACE.child("tenant", "b")
    cache = RadixCache(lambda slots: None)
    cache.shared = SharedPrefixes()
    cache.shared.add([1, 2, 3, 4])
    secret = [1, 2, 3, 4, 9, 9]
    assert cache.insert(secret, torch.arange(6), a) == 0
    # oracle: b shares exactly the public run (4 tokens), never a's tokens after it, equal as they are
    assert cache.match_prefix(secret, b).length == 4 and cache.match_prefix(secret, a).length == 6
    assert cache.insert(secret, torch.arange(10, 16), b) == 4
    assert cache.match_prefix(secret, b).slots.tolist() == [0, 1, 2, 3, 14, 15]
    assert cache.match_prefix([1, 2, 7], b).length == 2  # left the public text early: its first 2 tokens
    assert cache.insert([5, 6], torch.arange(20, 22), a) == 0  # no public part: a's own tree, as without sharing
    assert cache.match_prefix([5, 6], b).length == 0 and cache.match_prefix([5, 6], a).length == 2
    cache.check()
