"""Probes of tensor-parallel workers for tests: what a worker rank holds, read in its own process through
`TPWorkers.call` (the runtime ships the generic call, not the tests' questions)."""
from __future__ import annotations

from typing import Hashable

import torch

from ..runtime.distributed.embedding_cache import EmbeddingMirror
from ..runtime.distributed.workers import TPWorkers


def mirror_snapshot(mirror: EmbeddingMirror) -> tuple[dict[Hashable, torch.Tensor], int]:
    """A worker's embedding mirror (its entries, on the host) and the bytes it has received."""
    return {k: t.cpu() for k, t in mirror.entries.items()}, mirror.bytes_received


def inspect_embeddings(workers: TPWorkers) -> list[tuple[dict[Hashable, torch.Tensor], int]]:
    """Each worker's `mirror_snapshot`, in rank order."""
    return workers.call(mirror_snapshot)
