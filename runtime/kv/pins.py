"""Pins: locks on radix paths held for an owner that will come back (a prompt_cache_key session, a
running program), so LRU eviction does not throw away what is about to be extended.

A pin is a lock (`RadixCache.inc_lock_ref(node, pin=True)`) with an owner, an age and an expiry. Pins are
bounded and never block admission:
  - the tokens under pins stay within `budget` (max_pinned_fraction of the pool); past it the oldest pin
    that frees tokens is released first, to the young end of the LRU (its owner is likely back soon);
  - with `tenant_budget` (max_pinned_tokens_per_tenant), the tokens under one tenant's pins (its
    `account`: its cache namespace's `tenant`) stay within it too; past it that
    tenant's own oldest pin goes, so one tenant's sessions never release another tenant's pins for the
    shared budget's sake. A pin is never refused with an error: like OpenAI's prompt caching, a
    prompt_cache_key is a hint, and a tenant over its share gets fewer cached tokens, not a 429;
  - under memory pressure the KV owner evicts unpinned LRU leaves first, then releases expired pins,
    then idle pins (no live request runs through them) oldest first; a pin a live request also locks
    frees nothing, so it is kept; what a queued request will hit (pinned or not) goes last;
  - `releasable` tokens (held by idle pins alone) count as room when admission asks what fits.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Callable

from ..namespace import DEFAULT_NAMESPACE, Namespace
from .radix_cache import RadixCache, TreeNode


@dataclass(slots=True)
class Pin:
    owner: str  # one pin per owner: pinning again moves it
    group: str  # released together (a program's states)
    node: TreeNode  # the pinned path ends here
    tokens: int  # the path's length
    touched: float  # when last pinned or refreshed: the age the oldest-first order reads
    expires: float  # monotonic time; math.inf: until released
    account: Namespace = DEFAULT_NAMESPACE  # the tenant (Namespace.tenant) whose share of the pinned budget it counts against


@dataclass(slots=True)
class PinStats:
    released_under_pressure: int = 0  # pins given up for memory or for the pinned budget
    expired: int = 0


@dataclass
class PinTable:
    cache: RadixCache
    budget: int  # most tokens under pins at once
    tenant_budget: int = 0  # most tokens under one account's pins at once; 0: no cap but `budget`
    clock: Callable[[], float] = time.monotonic
    pins: dict[str, Pin] = field(default_factory=dict)
    stats: PinStats = field(default_factory=PinStats)
    _next_expiry: float = math.inf

    def pin(self, owner: str, node: TreeNode, tokens: int, ttl: float | None, group: str | None = None,
            account: Namespace = DEFAULT_NAMESPACE) -> bool:
        """Pins the path ending at `node` for `owner` (replacing its previous pin) for `ttl` seconds
        (None: until released), counted against `account`'s share. Returns False when the pin alone exceeds
        the budget or the account's share (nothing pinned)."""
        now = self.clock()
        old = self.pins.pop(owner, None)
        over_share = 0 < self.tenant_budget < tokens
        if tokens <= 0 or tokens > self.budget or over_share or node.parent is None:  # a root: nothing to pin
            if old is not None:
                self._drop(old)
            return False
        self.cache.inc_lock_ref(node, pin=True)
        if old is not None:
            self._drop(old)
        expires = math.inf if ttl is None else now + ttl
        self.pins[owner] = Pin(owner, group or owner, node, tokens, now, expires, account)
        self._next_expiry = min(self._next_expiry, expires)
        self._enforce_tenant_budget(account)
        self._enforce_budget()
        return owner in self.pins

    def refresh(self, owner: str, ttl: float | None) -> bool:
        """A new request of the owner arrived: its pin is young again and its TTL restarts."""
        pin = self.pins.get(owner)
        if pin is None:
            return False
        pin.touched = self.clock()
        pin.expires = math.inf if ttl is None else pin.touched + ttl
        self._next_expiry = min(self._next_expiry, pin.expires)
        return True

    def unpin(self, owner: str) -> int:
        """Releases the owner's pin; how many tokens it pinned (0: it had none)."""
        pin = self.pins.pop(owner, None)
        if pin is None:
            return 0
        self._drop(pin)
        return pin.tokens

    def unpin_group(self, group: str) -> int:
        """Releases every pin of `group`; how many there were."""
        owners = [p.owner for p in self.pins.values() if p.group == group]
        for owner in owners:
            self.unpin(owner)
        return len(owners)

    def unpin_where(self, keep: Callable[[Pin], bool]) -> None:
        """Releases every pin `keep` refuses."""
        for pin in [p for p in self.pins.values() if not keep(p)]:
            self.unpin(pin.owner)

    def unpin_all(self) -> None:
        for owner in list(self.pins):
            self.unpin(owner)

    def expire(self) -> int:
        """Releases the pins whose TTL ran out; how many. Cheap when none is due."""
        now = self.clock()
        if now < self._next_expiry:
            return 0
        due = [p.owner for p in self.pins.values() if p.expires <= now]
        for owner in due:
            self.unpin(owner)
        self.stats.expired += len(due)
        self._next_expiry = min((p.expires for p in self.pins.values()), default=math.inf)
        return len(due)

    @property
    def releasable(self) -> int:
        """Tokens that releasing idle pins would make evictable."""
        return self.cache.idle_pinned_size

    def release_oldest_idle(self, wanted: bool = True) -> bool:
        """Releases the oldest pin no live request runs through (one that frees something); False if none.
        `wanted=False` skips pins a queued request will hit (releasing them frees nothing evicted first)."""
        idle = [p for p in self.pins.values()
                if p.node.lock_ref == p.node.pin_ref and (wanted or not p.node.want_ref)]
        if not idle:
            return False
        self.unpin(min(idle, key=lambda p: p.touched).owner)
        self.stats.released_under_pressure += 1
        return True

    def _enforce_budget(self) -> None:
        """Releases the oldest pins until the budget holds; a pin whose path other pins extend (a forked
        session's parent under its sub-agents' pins) frees nothing, so it is kept while another would."""
        while self.cache.pinned_size > self.budget:
            self._release_oldest(list(self.pins.values()))

    def _release_oldest(self, pins: list[Pin]) -> None:
        """Releases the oldest of `pins` for a budget's sake, one that frees something first."""
        oldest = min([p for p in pins if p.node.pin_ref == 1] or pins, key=lambda p: p.touched)
        self.unpin(oldest.owner)
        self.cache.touch(oldest.node)  # held until now: the LRU ranks it as used now, after one-shot prompts
        self.stats.released_under_pressure += 1

    def account_size(self, account: Namespace) -> int:
        """Distinct tokens under `account`'s pins (paths its pins share, a forked session's, count once)."""
        seen: set[int] = set()
        size = 0
        for pin in self.pins.values():
            if pin.account != account:
                continue
            node = pin.node
            while node.parent is not None and id(node) not in seen:
                seen.add(id(node))
                size += len(node.key)
                node = node.parent
        return size

    def _enforce_tenant_budget(self, account: Namespace) -> None:
        """Releases `account`'s own oldest pins until its share holds, those that free something first (as
        `_enforce_budget`); other accounts' pins are never touched."""
        while self.tenant_budget and self.account_size(account) > self.tenant_budget:
            self._release_oldest([p for p in self.pins.values() if p.account == account])

    def _drop(self, pin: Pin) -> None:
        self.cache.dec_lock_ref(pin.node, pin=True)

    def check(self) -> None:
        """Every pin's path is in the tree; pinned tokens within the budget."""
        for pin in self.pins.values():
            assert self.cache.contains(pin.node), f"pin {pin.owner!r} lost its path"
        assert self.cache.pinned_size <= self.budget, "pinned tokens exceed the budget"
        if self.tenant_budget:
            for account in {p.account for p in self.pins.values()}:
                assert self.account_size(account) <= self.tenant_budget, f"{account} exceeds its pinned share"
