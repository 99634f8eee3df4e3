"""The LRU of image embeddings, keyed by the full image key and bounded in bytes: the one cache behind
every rank's image side (rank 0's encoder and, under tensor parallelism, the broadcast that mirrors it)."""
from __future__ import annotations

from collections import OrderedDict
from typing import Hashable

import torch


def nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()


class EmbeddingCache:
    def __init__(self, capacity_bytes: int):
        if capacity_bytes < 0:
            raise ValueError(f"embedding cache capacity must be >= 0 bytes, got {capacity_bytes}")
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[Hashable, torch.Tensor] = OrderedDict()

    def __contains__(self, key: Hashable) -> bool:
        return key in self._entries

    def get(self, key: Hashable) -> torch.Tensor | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def fits(self, value: torch.Tensor) -> bool:
        return nbytes(value) <= self.capacity_bytes

    def put(self, key: Hashable, value: torch.Tensor) -> list[Hashable]:
        """Stores `value` (unless it is larger than the whole cache, or `key` is already there); returns the
        keys evicted to make room, least recently used first."""
        size = nbytes(value)
        if size > self.capacity_bytes or key in self._entries:
            return []
        evicted = []
        while self.size_bytes + size > self.capacity_bytes:
            old, dropped = self._entries.popitem(last=False)
            self.size_bytes -= nbytes(dropped)
            evicted.append(old)
        self._entries[key] = value
        self.size_bytes += size
        return evicted

    def clear(self) -> None:
        self._entries.clear()
        self.size_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)
