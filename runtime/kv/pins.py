"""Pins: locks on radix paths held for an owner that will come back (a prompt_cache_key session, a
running program), so LRU eviction does not throw away what is about to be extended.

A pin is a lock (`RadixCache.inc_lock_ref(node, pin=True)`) with an owner, an age and an expiry. Pins are
bounded and never block admission:
  - the tokens under pins stay within `budget` (max_pinned_fraction of the pool); past it the oldest pin
    that frees tokens is released first, to the young end of the LRU (its owner is likely back soon);
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

from .radix_cache import RadixCache, TreeNode


@dataclass(slots=True)
class Pin:
    owner: str  # one pin per owner: pinning again moves it
    group: str  # released together (a program's states)
    node: TreeNode  # the pinned path ends here
    tokens: int  # the path's length
    touched: float  # when last pinned or refreshed: the age the oldest-first order reads
    expires: float  # monotonic time; math.inf: until released


@dataclass(slots=True)
class PinStats:
    released_under_pressure: int = 0  # pins given up for memory or for the pinned budget
    expired: int = 0


@dataclass
class PinTable:
    cache: RadixCache
    budget: int  # most tokens under pins at once
    clock: Callable[[], float] = time.monotonic
    pins: dict[str, Pin] = field(default_factory=dict)
    stats: PinStats = field(default_factory=PinStats)
    _next_expiry: float = math.inf

    def pin(self, owner: str, node: TreeNode, tokens: int, ttl: float | None, group: str | None = None) -> bool:
        """Pins the path ending at `node` for `owner` (replacing its previous pin) for `ttl` seconds
        (None: until released). Returns False when the pin alone exceeds the budget (nothing pinned)."""
        now = self.clock()
        old = self.pins.pop(owner, None)
        if tokens <= 0 or tokens > self.budget or node.parent is None:  # a root: nothing to pin
            if old is not None:
                self._drop(old)
            return False
        self.cache.inc_lock_ref(node, pin=True)
        if old is not None:
            self._drop(old)
        expires = math.inf if ttl is None else now + ttl
        self.pins[owner] = Pin(owner, group or owner, node, tokens, now, expires)
        self._next_expiry = min(self._next_expiry, expires)
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
            freeing = [p for p in self.pins.values() if p.node.pin_ref == 1] or list(self.pins.values())
            oldest = min(freeing, key=lambda p: p.touched)
            self.unpin(oldest.owner)
            self.cache.touch(oldest.node)  # held until now: the LRU ranks it as used now, after one-shot prompts
            self.stats.released_under_pressure += 1

    def _drop(self, pin: Pin) -> None:
        self.cache.dec_lock_ref(pin.node, pin=True)

    def check(self) -> None:
        """Every pin's path is in the tree; pinned tokens within the budget."""
        for pin in self.pins.values():
            assert self.cache.contains(pin.node), f"pin {pin.owner!r} lost its path"
        assert self.cache.pinned_size <= self.budget, "pinned tokens exceed the budget"
