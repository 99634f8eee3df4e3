"""An LRU cache of image embeddings, keyed by the full 128-bit image key and bounded in bytes."""
from __future__ import annotations

from collections import OrderedDict

import torch


class EmbeddingCache:
    def __init__(self, capacity_bytes: int):
        self.capacity_bytes = capacity_bytes
        self.size_bytes = 0
        self._entries: OrderedDict[int, torch.Tensor] = OrderedDict()

    def get(self, key: int) -> torch.Tensor | None:
        value = self._entries.get(key)
        if value is not None:
            self._entries.move_to_end(key)
        return value

    def put(self, key: int, value: torch.Tensor) -> None:
        nbytes = value.numel() * value.element_size()
        if nbytes > self.capacity_bytes or key in self._entries:
            return
        while self.size_bytes + nbytes > self.capacity_bytes:
            _, old = self._entries.popitem(last=False)
            self.size_bytes -= old.numel() * old.element_size()
        self._entries[key] = value
        self.size_bytes += nbytes

    def clear(self) -> None:
        self._entries.clear()
        self.size_bytes = 0

    def __len__(self) -> int:
        return len(self._entries)
