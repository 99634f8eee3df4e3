"""The one call that turns an image into embeddings: `ImageEncoder.embed(key, pixels)`, behind the LRU
embedding cache. Under tensor parallelism a wrapper can put rank 0's encode + broadcast here."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from .cache import EmbeddingCache


@dataclass(slots=True)
class EncoderCounters:
    encodes: int = 0  # images run through the vision tower
    cache_hits: int = 0  # images whose embeddings came from the cache


class ImageEncoder:
    def __init__(self, vision: nn.Module, cache_bytes: int, device: torch.device, dtype: torch.dtype):
        self.vision = vision
        self.cache = EmbeddingCache(cache_bytes)
        self.device, self.dtype = device, dtype
        self.counters = EncoderCounters()

    def embed(self, key: int, pixels: torch.Tensor) -> torch.Tensor:
        """[feature rows, hidden] embeddings of the image named `key`, from its preprocessed pixels."""
        cached = self.cache.get(key)
        if cached is not None:
            self.counters.cache_hits += 1
            return cached
        with torch.no_grad():
            out = self.vision.encode(pixels.to(self.device, self.dtype))
        self.counters.encodes += 1
        self.cache.put(key, out)
        return out
