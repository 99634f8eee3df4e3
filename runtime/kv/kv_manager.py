"""The one owner of KV memory: the slot allocator, req_to_token rows, the radix cache and swap.

Only this module assigns a request's KV fields (`row`, `kv_len`, `slot_len`, `cached_len`,
`last_node`, `swapped`). For a request holding a row:
  positions [0, cached_len)        tree slots, locked through `last_node`;
  positions [cached_len, kv_len)   slots the request owns, KV computed;
  positions [kv_len, slot_len)     slots allocated for a step still in flight.
A request's slots go back to the tree (computed, cacheable tokens) or to the allocator (the rest)
exactly once, in `release`. Pins (runtime/kv/pins.py) hold tree paths for owners that will come back; a
pinned slot is a tree slot, and the invariant counts it there.

Every lookup and insert is keyed by the sequence's namespace (runtime/namespace.py) as well as its tokens:
a request reuses only KV cached in its own namespace, and the host tier and the evicted-path history keep
namespaces apart the same way.
"""
from __future__ import annotations

from collections import Counter
from typing import Callable, Iterable, Sequence

import torch

from ..namespace import DEFAULT_NAMESPACE, Namespace
from ..request import KVSeq
from .host_tier import EvictedPrefixes, HostTier
from .memory import KVPool, ReqToToken, SlotAllocator
from .pins import PinTable
from .radix_cache import RadixCache, TreeNode
from .shared_prefix import SharedPrefixes

HISTORY_POOLS = 4  # evicted token paths remembered (no KV), in pool sizes: "recomputed, was cached" counts these
HISTORY_MAX_TOKENS = 1 << 21  # ... and at most this many (a token of a remembered path costs ~40 host bytes)
MIN_RESTORE = 16  # fewer host-tier tokens than this are recomputed: a copy's fixed cost would exceed theirs


class KVManager:
    def __init__(self, pool: KVPool, allocator: SlotAllocator, req_to_token: ReqToToken, cache: RadixCache,
                 max_pinned_fraction: float = 0.5, host_tokens: int = 0, min_restore: int = MIN_RESTORE,
                 max_pinned_tokens_per_tenant: int = 0):
        self.pool, self.allocator, self.req_to_token, self.cache = pool, allocator, req_to_token, cache
        self.pins = PinTable(cache, int(pool.num_slots * max_pinned_fraction), max_pinned_tokens_per_tenant)
        self.host = HostTier(host_tokens, pool.groups()) if host_tokens else None
        self.evicted = EvictedPrefixes(min(HISTORY_POOLS * pool.num_slots, HISTORY_MAX_TOKENS) + host_tokens)
        self.min_restore = min_restore
        cache.on_evict = self._on_evict

    # ---- queries ------------------------------------------------------------------------------
    @property
    def cache_enabled(self) -> bool:
        return not self.cache.disable

    @property
    def num_free_rows(self) -> int:
        return self.req_to_token.num_free_rows

    @property
    def num_slots(self) -> int:
        return self.pool.num_slots

    @property
    def num_free_slots(self) -> int:
        return self.allocator.num_free

    @property
    def cached_tokens(self) -> int:
        return self.cache.total_size

    @property
    def reachable_slots(self) -> int:
        """Slots admission can have without waiting for a live request: free, evictable, under idle pins."""
        return self.allocator.num_free + self.cache.evictable_size + self.pins.releasable

    def cached_prefix_len(self, tokens: list[int], namespace: Namespace = DEFAULT_NAMESPACE) -> int:
        return self.cache.match_prefix(tokens, namespace).length

    def previously_cached(self, tokens: list[int], cached: int, namespace: Namespace = DEFAULT_NAMESPACE) -> int:
        """Of `tokens`, beyond the `cached` ones reused, how many were cached before and evicted."""
        return max(0, self.evicted.seen(tokens, namespace) - cached)

    def can_fit(self, n: int, reserve: int, waive_reserve: bool) -> bool:
        """Whether n slots can be had now (evicting if needed) with `reserve` more still reachable.

        Pins yield to a request that would otherwise wait on them alone: one that does not fit in the
        unpinned memory even once the live requests' slots come back (and one that runs alone). With a host
        tier they yield without that wait: a released pin's KV parks there and its owner copies it back
        (~100x cheaper than the recompute the wait protects against), while the wait costs this request
        live requests' whole remaining decodes of time to first token."""
        if not waive_reserve:
            unpinned = self.allocator.num_free + self.cache.evictable_size
            if unpinned < n + reserve:
                if unpinned + self.pins.releasable < n + reserve:
                    return False  # not even idle pins make room: wait for live requests to finish
                if self.host is None and unpinned + self._held_by_live() >= n + reserve:
                    return False  # live requests will make room: wait for them, keeping the pins
        return self.ensure_free(n)

    def _held_by_live(self) -> int:
        """Live requests' own slots, and the unpinned tree paths they lock: evictable once they finish."""
        return (self.num_slots - self.allocator.num_free - self.cache.total_size
                + self.cache.protected_size - self.cache.pinned_size)

    def ensure_free(self, n: int) -> bool:
        """Frees slots until n are free: unpinned LRU leaves no queued request will hit first, then expired
        pins, then idle pins oldest first (so no request waits on a pin it could evict); what a queued
        request will hit goes last, by the same order."""
        for wanted in (False, True):
            self._evict_to(n, wanted)
            if self.allocator.num_free < n and self.pins.expire():
                self._evict_to(n, wanted)
            while self.allocator.num_free < n and self.pins.release_oldest_idle(wanted):
                self._evict_to(n, wanted)
        return self.allocator.num_free >= n

    @staticmethod
    def _row(req: KVSeq) -> int:
        assert req.row is not None, f"{req.rid} holds no row"
        return req.row

    def _evict_to(self, n: int, wanted: bool) -> None:
        short = n - self.allocator.num_free
        if short > 0:
            self.cache.evict(short, wanted)

    def want(self, req: KVSeq) -> None:
        """`req` waits in the queue: the cached prefix it will hit is evicted last, until it is admitted
        or leaves (`release`). Matched once, on arrival or preemption."""
        if self.cache_enabled and req.swapped is None:
            req.wanted = self.cache.match_prefix(req.tokens(0, req.fill_len), req.namespace).node
            self.cache.want(req.wanted, 1)

    def _unwant(self, req: KVSeq) -> None:
        if req.wanted is not None:
            self.cache.want(req.wanted, -1)
            req.wanted = None

    # ---- verbs --------------------------------------------------------------------------------
    def admit(self, req: KVSeq, match_limit: int, budget: int, fits: Callable[[int], bool]) -> int | None:
        """Gives `req` a row holding its longest cached prefix (up to `match_limit` tokens), locked.
        Returns how many tokens to extend now (at most `budget`), or None (nothing held) when
        `fits(that many)` says no."""
        key = req.tokens(0, match_limit)
        self._restore(key, req.namespace, fits, budget)
        match = self.cache.match_prefix(key, req.namespace)
        self.cache.inc_lock_ref(match.node)  # before any eviction, so the match survives it
        n = min(req.fill_len - match.length, budget)
        if not fits(n):
            self.cache.dec_lock_ref(match.node)
            return None
        self._unwant(req)
        req.row = self.req_to_token.alloc_row()
        self.req_to_token.write(req.row, 0, match.slots)
        req.kv_len = req.cached_len = req.slot_len = match.length
        req.last_node = match.node
        return n

    def _restore(self, key: list[int], namespace: Namespace, fits: Callable[[int], bool], chunk: int) -> None:
        """Copies back from the host tier the KV of `key` it holds beyond the device tree's match, when
        `fits` makes room for it: by the same rules as the recompute it saves, which needs those slots too.
        When the whole of it does not fit, its first `chunk` tokens (what a recompute would take now) do."""
        if self.host is None or not self.cache_enabled:
            return
        match, hosted = self.cache.match_prefix(key, namespace), self.host.match(key, namespace)
        extra = hosted.length - match.length
        if extra < self.min_restore:
            return
        self.cache.inc_lock_ref(match.node)  # room is made around both prefixes
        self.host.cache.inc_lock_ref(hosted.node)
        sizes = [n for n in (extra, min(extra, chunk)) if n >= self.min_restore]
        size = next((n for n in sizes if fits(n)), 0)
        self.host.cache.dec_lock_ref(hosted.node)
        self.cache.dec_lock_ref(match.node)
        if not size:
            return
        end = match.length + size
        slots = self.allocator.alloc(size)
        assert slots is not None, "`fits` said the free slots suffice"
        self.host.restore(hosted.slots[match.length:end], slots, self.pool.groups())
        present = self.cache.insert(key[:end], torch.cat((match.slots, slots)), namespace)
        assert present == match.length, "the locked device prefix must still be there"

    def _on_evict(self, leaf: TreeNode) -> None:
        """A leaf leaves the device tree: its path is remembered, and its KV parks in the host tier."""
        path, namespace = self.cache.path_key(leaf), self.cache.namespace_of(leaf)
        self.evicted.record(path, namespace)
        if self.host is not None:
            self.host.park(path, namespace, self.cache.path_slots(leaf), self.pool.groups())

    def swap_in(self, req: KVSeq, fits: Callable[[int], bool]) -> bool:
        """Brings a swapped-out request's KV back into fresh slots, if `fits(those + its pending)`."""
        assert req.swapped is not None
        if not fits(req.kv_len + req.pending):
            return False
        slots = self.allocator.alloc(req.kv_len)
        assert slots is not None, "`fits` said the free slots suffice"
        self.pool.swap_in(slots, req.swapped)
        req.swapped = None
        req.row = self.req_to_token.alloc_row()
        self.req_to_token.write(req.row, 0, slots)
        req.slot_len = req.kv_len
        req.cached_len, req.last_node = 0, self.cache.root
        return True

    def extend(self, req: KVSeq, n: int) -> int:
        """Allocates slots for the next n positions; returns the first of them. The caller made room."""
        return self.extend_all([(req, n)])[0]

    def extend_all(self, plan: Sequence[tuple[KVSeq, int]]) -> list[int]:
        """`extend` for each (request, n), in one allocation and one table write."""
        starts = [req.kv_len for req, _ in plan]
        lens = [n for _, n in plan]
        slots = self.allocator.alloc(sum(lens))
        assert slots is not None, "allocation after ensure_free cannot fail"
        self.req_to_token.write_runs([self._row(req) for req, _ in plan], starts, lens, slots)
        for (req, n), start in zip(plan, starts):
            req.slot_len = start + n
        return starts

    def computed(self, req: KVSeq, end: int) -> None:
        """The step that computed positions up to `end` finished."""
        req.kv_len = end

    def commit(self, req: KVSeq) -> None:
        """Hands the computed prefix to the tree, so concurrent requests can share it now."""
        if not self.cache_enabled:
            return
        key = req.tokens(0, req.kv_len)
        slots = self.req_to_token.read(self._row(req), 0, req.kv_len)
        present = self.cache.insert(key, slots, req.namespace)
        self.allocator.free(slots[req.cached_len:present])
        match = self.cache.match_prefix(key, req.namespace)
        assert match.length == req.kv_len, "prefix just inserted must match in full"
        self.req_to_token.write(self._row(req), 0, match.slots)
        self._relock(req, match.node, req.kv_len)

    def truncate(self, req: KVSeq, length: int) -> None:
        """Forgets the KV of positions >= length (rejected draft tokens): owned slots go back to the
        allocator; tree-owned ones stay cached and the lock moves to the shallower node."""
        if req.kv_len <= length:
            return
        assert req.slot_len == req.kv_len, "no step may be in flight"
        self.allocator.free(self.req_to_token.read(self._row(req), max(length, req.cached_len), req.kv_len))
        if req.cached_len > length:
            match = self.cache.match_prefix(req.tokens(0, length), req.namespace)
            assert match.length == length, "a locked prefix must still be in the tree"
            self._relock(req, match.node, length)
        req.kv_len = req.slot_len = length

    def keep_path(self, req: KVSeq, first: int, kept: list[int]) -> None:
        """After a draft tree's verify: the KV of positions `kept` (ascending, >= first; a root-first path
        of tree nodes) moves to positions first, first + 1, ... by moving slot indices in the request's
        row (a token's K/V depends on its ancestors only, which the tree mask gave it); every other
        slot from `first` on goes back to the allocator. Nothing of the tree has reached the radix tree."""
        assert req.slot_len == req.kv_len and req.cached_len <= first, "a verified tree is owned, not cached"
        row = self._row(req)
        slots = self.req_to_token.read(row, first, req.kv_len)
        keep = torch.zeros(slots.numel(), dtype=torch.bool, device=slots.device)
        offsets = torch.tensor([p - first for p in kept], dtype=torch.int64, device=slots.device)
        keep[offsets] = True
        self.allocator.free(slots[~keep])
        self.req_to_token.write(row, first, slots[offsets])
        req.kv_len = req.slot_len = first + len(kept)

    def release(self, req: KVSeq, cache_computed: bool = True) -> None:
        """Gives back the request's row and KV: computed tokens to the tree, the rest to the allocator."""
        self._unwant(req)
        if req.row is None:
            req.swapped = None
            return
        slots = self.req_to_token.read(req.row, 0, req.slot_len)
        if cache_computed and self.cache_enabled and req.kv_len > req.cached_len:
            present = self.cache.insert(req.tokens(0, req.kv_len), slots[: req.kv_len], req.namespace)
            self.allocator.free(slots[req.cached_len:present])
            self.allocator.free(slots[req.kv_len:])
        else:
            self.allocator.free(slots[req.cached_len:])
        assert req.last_node is not None, "a request holding a row locks its cached prefix"
        self.cache.dec_lock_ref(req.last_node)
        self.req_to_token.free_row(req.row)
        req.row, req.last_node, req.swapped = None, None, None
        req.kv_len = req.cached_len = req.slot_len = 0

    def swap_out(self, req: KVSeq) -> None:
        """Copies the computed KV to host memory and releases the slots; `swap_in` restores it."""
        kv_len = req.kv_len
        saved = self.pool.swap_out(self.req_to_token.read(self._row(req), 0, kv_len))
        self.release(req, cache_computed=False)
        req.swapped, req.kv_len = saved, kv_len

    # ---- pins -----------------------------------------------------------------------------------
    def share_prefix(self, tokens: Sequence[int]) -> None:
        """Declares `tokens` a public prefix: its KV is shared across namespaces (runtime/kv/shared_prefix.py),
        in each of this owner's trees."""
        if self.cache.shared is None:
            self.cache.shared = SharedPrefixes()
            self.evicted.tree.shared = self.cache.shared
            if self.host is not None:
                self.host.cache.shared = self.cache.shared
        self.cache.shared.add(tokens)

    def pin(self, owner: str, tokens: list[int], ttl: float | None, group: str | None = None,
            namespace: Namespace = DEFAULT_NAMESPACE) -> int:
        """Pins the cached prefix of `tokens` in `namespace` for `owner` (see runtime/kv/pins.py); how many
        tokens that is (0: none cached, or over the pinned budget)."""
        if not self.cache_enabled:
            return 0
        match = self.cache.match_prefix(tokens, namespace)
        pinned = self.pins.pin(owner, match.node, match.length, ttl, group, namespace.tenant)
        return match.length if pinned else 0

    def flush(self) -> bool:
        """Releases every pin and evicts every cached prefix not in use; True when the tree is empty."""
        self.pins.unpin_all()
        self.cache.on_evict = None  # a flush forgets: nothing parks in the host tier...
        self.cache.evict(self.cache.evictable_size)
        self.cache.on_evict = self._on_evict
        self.evicted.clear()  # ...and what was evicted before does not count as "recomputed, was cached" after
        if self.host is not None:
            self.host.flush()
        return self.cache.total_size == 0

    def drop_namespaces(self, kind: str, value: str) -> int:
        """Frees the cached KV of every namespace holding part (kind, value) (an unloaded LoRA adapter's, under
        any tenant): its pins are released and its unlocked paths evicted, not parked in the host tier (nothing
        will match them again). Returns the tokens freed."""
        def inside(namespace: Namespace) -> bool:
            return (kind, value) in namespace.parts

        self.pins.unpin_where(lambda pin: not inside(self.cache.namespace_of(pin.node)))
        self.cache.on_evict = None
        try:
            return self.cache.evict(self.cache.evictable_size, where=inside)
        finally:
            self.cache.on_evict = self._on_evict

    def _relock(self, req: KVSeq, node: TreeNode, cached_len: int) -> None:
        self.cache.inc_lock_ref(node)
        assert req.last_node is not None, "a request holding a row locks its cached prefix"
        self.cache.dec_lock_ref(req.last_node)
        req.last_node, req.cached_len = node, cached_len

    # ---- invariants ---------------------------------------------------------------------------
    def check(self, running: Iterable[KVSeq], waiting: Iterable[KVSeq]) -> None:
        """free + in tree (pinned or not) + held by live requests = every slot, each exactly once; locks
        match their users: live requests and pins."""
        self.cache.check()
        self.pins.check()
        if self.host is not None:
            self.host.check()
        running = list(running)
        held: list[torch.Tensor] = []
        expected_locks: Counter[int] = Counter()
        for req in running:
            assert req.row is not None, f"running request {req.rid} has no row"
            assert req.wanted is None, f"running request {req.rid} still wants a queued hit"
            assert req.cached_len <= req.kv_len <= req.slot_len <= req.fill_len, f"bad lengths in {req.rid}"
            assert req.last_node is not None, f"running request {req.rid} locks no prefix"
            held.append(self.req_to_token.read(req.row, req.cached_len, req.slot_len))
            path = self.cache.path_slots(req.last_node)
            assert torch.equal(path, self.req_to_token.read(req.row, 0, req.cached_len)), \
                f"request {req.rid} does not use its locked prefix"
            node = req.last_node
            while node.parent is not None:
                expected_locks[id(node)] += 1
                node = node.up
        expected_wants: Counter[int] = Counter()
        for req in waiting:
            assert req.row is None and req.last_node is None, f"waiting request {req.rid} holds KV"
            wanted = req.wanted
            while wanted is not None and wanted.parent is not None:
                expected_wants[id(wanted)] += 1
                wanted = wanted.parent
        expected_pins: Counter[int] = Counter()
        for pin in self.pins.pins.values():
            node = pin.node
            while node.parent is not None:
                expected_locks[id(node)] += 1
                expected_pins[id(node)] += 1
                node = node.up
        for node in self.cache.nodes():
            assert node.lock_ref == expected_locks[id(node)], "tree lock_ref differs from live requests + pins"
            assert node.pin_ref == expected_pins[id(node)], "tree pin_ref differs from the pin table"
            assert node.want_ref == expected_wants[id(node)], "tree want_ref differs from the queue"
        parts = [self.allocator.free_slots(), self.cache.all_slots(), *held]
        counts = torch.bincount(torch.cat(parts).cpu(), minlength=self.pool.num_slots)
        assert counts.numel() == self.pool.num_slots, "slot index out of range"
        leaked = (counts == 0).nonzero().flatten().tolist()
        doubled = (counts > 1).nonzero().flatten().tolist()
        assert not leaked and not doubled, f"KV slots leaked {leaked[:8]} / double-owned {doubled[:8]}"
        rows = self.req_to_token.num_free_rows + len(running)
        assert rows == self.req_to_token.table.shape[0], "req_to_token row leaked"
