"""Image embeddings under tensor parallelism: rank 0 encodes an image once and broadcasts the result;
every rank keeps it by the image's key, so a repeated image is neither encoded nor sent again.

Rank 0's LRU decides what stays: each broadcast names the keys it evicted, so the workers' mirrors hold
exactly rank 0's keys and rank 0 never sends a key a worker already has.
"""
from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

import torch

# sends one new entry to the worker ranks: (key, embeddings, keys evicted to make room)
Publish = Callable[[bytes, torch.Tensor, list[bytes]], None]


@dataclass(slots=True)
class EmbeddingCounters:
    encodes: int = 0  # calls of an encoder (cache misses)
    hits: int = 0
    bytes_sent: int = 0  # embedding bytes broadcast to the other ranks


class EmbeddingLRU:
    """Tensors by key; past `capacity_bytes` the least recently used go."""

    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise ValueError(f"embedding cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.used_bytes = 0
        self._entries: OrderedDict[bytes, torch.Tensor] = OrderedDict()

    def __contains__(self, key: bytes) -> bool:
        return key in self._entries

    def get(self, key: bytes) -> torch.Tensor | None:
        t = self._entries.get(key)
        if t is not None:
            self._entries.move_to_end(key)
        return t

    def put(self, key: bytes, t: torch.Tensor) -> list[bytes]:
        """Stores `t`; returns the keys evicted for it."""
        size = t.numel() * t.element_size()
        if size > self.capacity_bytes:
            raise ValueError(f"an image's embeddings take {size} bytes, more than the whole embedding cache "
                             f"({self.capacity_bytes} bytes); raise its capacity")
        evicted = []
        while self.used_bytes + size > self.capacity_bytes:
            old, dropped = self._entries.popitem(last=False)
            self.used_bytes -= dropped.numel() * dropped.element_size()
            evicted.append(old)
        self._entries[key] = t
        self.used_bytes += size
        return evicted


class BroadcastEmbeddingCache:
    """Rank 0's side: `get(key, encode)` returns the embeddings for `key`, encoding and publishing them
    to the other ranks only on a miss. `publish` None: a single rank, nothing to send."""

    def __init__(self, capacity_mb: float, publish: Publish | None = None):
        self.lru = EmbeddingLRU(int(capacity_mb * 2**20))
        self.publish = publish
        self.counters = EmbeddingCounters()

    def get(self, key: bytes, encode: Callable[[], torch.Tensor]) -> torch.Tensor:
        hit = self.lru.get(key)
        if hit is not None:
            self.counters.hits += 1
            return hit
        t = encode().contiguous()
        self.counters.encodes += 1
        evicted = self.lru.put(key, t)
        if self.publish is not None:
            self.publish(key, t, evicted)
            self.counters.bytes_sent += t.numel() * t.element_size()
        return t


class EmbeddingMirror:
    """A worker rank's copy of rank 0's cache: entries arrive and leave only as rank 0 says."""

    def __init__(self) -> None:
        self.entries: dict[bytes, torch.Tensor] = {}
        self.bytes_received = 0

    def add(self, key: bytes, t: torch.Tensor, evicted: list[bytes]) -> None:
        for old in evicted:
            self.entries.pop(old, None)
        self.entries[key] = t
        self.bytes_received += t.numel() * t.element_size()

    def get(self, key: bytes) -> torch.Tensor:
        return self.entries[key]
