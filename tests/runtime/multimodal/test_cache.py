"""The embedding cache: LRU by bytes, keyed by the full 128-bit key."""
from __future__ import annotations

import torch

from radixlang.runtime.multimodal.cache import EmbeddingCache


def test_lru_eviction_keeps_the_cache_within_its_bytes():
    cache = EmbeddingCache(capacity_bytes=3 * 400)  # three [10, 10] fp32 entries
    keys = [(1 << 127) + i for i in range(4)]  # differ only in the low bits of a 128-bit key
    for i, k in enumerate(keys[:3]):
        cache.put(k, torch.full((10, 10), float(i)))
    assert cache.get(keys[0]) is not None  # now the most recent
    cache.put(keys[3], torch.zeros(10, 10))
    assert cache.get(keys[1]) is None and len(cache) == 3 and cache.size_bytes == 1200
    assert cache.get(keys[0])[0, 0] == 0 and cache.get(keys[2])[0, 0] == 2
    cache.put((1 << 128) - 1, torch.zeros(100, 100))  # larger than the whole cache: not kept
    assert len(cache) == 3
    cache.clear()
    assert len(cache) == 0 and cache.size_bytes == 0


def test_a_zero_byte_cache_keeps_nothing():
    cache = EmbeddingCache(0)
    cache.put(7, torch.zeros(1))
    assert cache.get(7) is None and len(cache) == 0
