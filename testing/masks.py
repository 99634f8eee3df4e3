"""Constraint masks built from a bool vector, for tests of the sampler and matchers (the runtime builds its
rows from stored bits: constrained/matcher.Matcher.mask_words)."""
from __future__ import annotations

import numpy as np


def pack_mask(allowed: np.ndarray) -> np.ndarray:
    """Bool [vocab] -> int32 [ceil(vocab/32)]: bit i of word w allows token 32w + i."""
    bits = np.packbits(allowed, bitorder="little")
    words = np.zeros(((len(bits) + 3) // 4) * 4, dtype=np.uint8)
    words[:len(bits)] = bits
    return words.view("<i4")
