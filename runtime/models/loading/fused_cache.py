"""HF folders' fused weights (q/k/v and gate/up, stacked at load) kept in the weight cache, loaded by mmap.

Every other weight of a folder in its own dtype is a view of the mapped safetensors; the fused ones are the
only tensors a load builds (torch.cat of two or three checkpoint tensors: ~2/3 of a Llama's weights). The
first load saves them as a weight-cache entry keyed by the folder and dtype, its identity the size and
mtime of every safetensors file, so a later load maps them instead, and a changed file rebuilds the entry.
"""
from __future__ import annotations

from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import nn

from ..llama import packed_parts, packed_target
from . import weight_cache

Weights = Iterable[tuple[str, torch.Tensor]]


class FusedCache:
    """One folder's entry: `cached` holds its fused tensors when the entry is valid (None: build them)."""

    def __init__(self, folder: Path, files: list[Path], dtype: torch.dtype):
        self.key = weight_cache.entry_key(folder, f"fused-{dtype}")
        self.identity = {"files": [weight_cache.source_identity(f) for f in files]}
        entry = weight_cache.load_entry(self.key, self.identity)
        self.cached = None if entry is None else entry[0]

    def weights(self, checkpoint: Weights) -> Iterator[tuple[str, torch.Tensor]]:
        """The checkpoint's tensors, with the cached fused tensors in place of their parts."""
        if self.cached is None:
            yield from checkpoint
            return
        yield from ((name, t) for name, t in checkpoint if packed_target(name.removeprefix("model."))[1] is None)
        yield from self.cached.items()

    def save(self, model: nn.Module) -> None:
        """Writes the model's fused tensors (on a background thread), unless they came from the entry."""
        if self.cached is not None:
            return
        fused: dict[str, torch.Tensor] = {name: p for name, p in model.named_parameters() if packed_parts(name)}
        weight_cache.save_entry_in_background(self.key, self.identity, fused, {})
