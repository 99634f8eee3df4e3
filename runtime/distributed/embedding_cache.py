"""Image embeddings under tensor parallelism: rank 0 encodes an image once and broadcasts the result;
every rank keeps it by the image's key, so a repeated image is neither encoded nor sent again.

Rank 0's LRU decides what stays: each broadcast names the keys it evicted, so the workers' mirrors hold
exactly rank 0's keys and rank 0 never sends a key a worker already has.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Hashable

import torch

from ..multimodal.cache import EmbeddingCache, nbytes

# sends one new entry to the worker ranks: (key, embeddings, keys evicted to make room)
Publish = Callable[[Hashable, torch.Tensor, list[Hashable]], None]


@dataclass(slots=True)
class EmbeddingCounters:
    encodes: int = 0  # calls of an encoder (cache misses)
    cache_hits: int = 0
    bytes_sent: int = 0  # embedding bytes broadcast to the other ranks


class BroadcastEmbeddingCache:
    """Rank 0's side: `get(key, encode)` returns the embeddings for `key`, encoding and publishing them
    to the other ranks only on a miss. `publish` None: a single rank, nothing to send (and an entry larger
    than the cache is used once and not kept, so capacity 0 turns the cache off)."""

    def __init__(self, capacity_mb: float, publish: Publish | None = None):
        self.lru = EmbeddingCache(int(capacity_mb * 2**20))
        self.publish = publish
        self.counters = EmbeddingCounters()

    def __contains__(self, key: Hashable) -> bool:
        return key in self.lru

    def get(self, key: Hashable, encode: Callable[[], torch.Tensor]) -> torch.Tensor:
        hit = self.lru.get(key)
        if hit is not None:
            self.counters.cache_hits += 1
            return hit
        t = encode().contiguous()
        self.counters.encodes += 1
        if self.publish is None:
            self.lru.put(key, t)
            return t
        if not self.lru.fits(t):  # the workers find embeddings only in their mirror of this cache
            raise ValueError(f"an image's embeddings take {nbytes(t)} bytes, more than the whole embedding "
                             f"cache ({self.lru.capacity_bytes} bytes); raise image_cache_mb")
        evicted = self.lru.put(key, t)
        self.publish(key, t, evicted)
        self.counters.bytes_sent += nbytes(t)
        return t

    def clear(self) -> None:
        if self.publish is not None:
            raise ValueError("the embedding cache cannot be cleared under tensor parallelism: the workers' "
                             "mirrors follow its evictions")
        self.lru.clear()


class EmbeddingMirror:
    """A worker rank's copy of rank 0's cache: entries arrive and leave only as rank 0 says."""

    def __init__(self) -> None:
        self.entries: dict[Hashable, torch.Tensor] = {}
        self.bytes_received = 0

    def add(self, key: Hashable, t: torch.Tensor, evicted: list[Hashable]) -> None:
        for old in evicted:
            self.entries.pop(old, None)
        self.entries[key] = t
        self.bytes_received += nbytes(t)

    def get(self, key: Hashable) -> torch.Tensor:
        t = self.entries.get(key)
        if t is None:  # rank 0 publishes before the step that uses it: the ranks are out of step
            raise KeyError(f"image embeddings {key!r} are not in this worker's mirror of rank 0's cache")
        return t
