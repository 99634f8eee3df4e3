"""Automata kept by exact content while constraints compile, so a language is determinized once.

A JSON schema repeats its leaves (the same string pattern with the same length bounds, the same
"any key but these" under many objects), and each costs a subset construction or a product. A
`DfaCache` maps a key made of the regex trees themselves (compared by value, never by a lossy hash;
`Compiled` leaves by the identity of their automaton) to the automaton built for it. The compiler
installs its engine-wide cache around each compile (`caching`); outside one, nothing is kept.
Cached automata are shared: their arrays are made read-only.
"""
from __future__ import annotations

import contextlib
import contextvars
import threading
from collections import OrderedDict
from typing import Any, Callable, Hashable, Iterator, Protocol, TypeVar

import numpy as np

from ...config import DFA_CACHE_BYTES, DFA_CACHE_ENTRIES


class Automaton(Protocol):
    """What the cache needs of a value: its tables, made read-only once shared, and sized for the bound."""

    @property
    def trans(self) -> np.ndarray: ...

    @property
    def accept(self) -> np.ndarray: ...


T = TypeVar("T", bound=Automaton)

_CURRENT: contextvars.ContextVar["DfaCache | None"] = contextvars.ContextVar("dfa_cache", default=None)


class DfaCache:
    """An LRU of automata by content key, bounded by the bytes of their tables and by count; thread-safe."""

    def __init__(self, max_bytes: int = DFA_CACHE_BYTES, max_entries: int = DFA_CACHE_ENTRIES):
        self.max_bytes, self.max_entries = max_bytes, max_entries
        self.bytes = 0
        self._items: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def __contains__(self, key: Hashable) -> bool:
        with self._lock:
            return key in self._items

    def get(self, key: Hashable, build: Callable[[], T]) -> T:
        with self._lock:
            hit = self._items.get(key)
            if hit is not None:
                self._items.move_to_end(key)
                return hit[0]
        value = build()  # outside the lock: builds nest (a product builds its parts), and may be slow
        value.trans.flags.writeable = False
        value.accept.flags.writeable = False
        cost = int(value.trans.nbytes + value.accept.nbytes)
        with self._lock:
            if key not in self._items:
                self._items[key] = (value, cost)
                self.bytes += cost
            while len(self._items) > 1 and (self.bytes > self.max_bytes or len(self._items) > self.max_entries):
                self.bytes -= self._items.popitem(last=False)[1][1]
        return value


@contextlib.contextmanager
def caching(cache: DfaCache | None) -> Iterator[None]:
    """Automata built inside (in this thread or task) are looked up in, and kept in, `cache`."""
    token = _CURRENT.set(cache)
    try:
        yield
    finally:
        _CURRENT.reset(token)


def current() -> DfaCache | None:
    return _CURRENT.get()


def cached(key: Hashable, build: Callable[[], T]) -> T:
    """`build()`, or the automaton built before for `key` in the installed cache."""
    cache = _CURRENT.get()
    return build() if cache is None else cache.get(key, build)
