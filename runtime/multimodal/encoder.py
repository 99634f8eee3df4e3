"""The one call that turns a step's image parts into embeddings: `ImageEncoder.embed_step`, behind the
LRU embedding cache. Under tensor parallelism that cache is rank 0's broadcast cache: an image is encoded
once, on rank 0, and its embeddings go to every rank's mirror before the step that uses them."""
from __future__ import annotations

from typing import Protocol

import torch

from ..distributed.embedding_cache import BroadcastEmbeddingCache, EmbeddingCounters
from .prompt import StepImages, embed_parts


class VisionEncoder(Protocol):
    def encode(self, pixels: torch.Tensor, /) -> torch.Tensor:
        """One image's pixels -> its [feature rows, hidden] embeddings."""
        ...


class ImageEncoder:
    def __init__(self, vision: VisionEncoder, cache: BroadcastEmbeddingCache, device: torch.device, dtype: torch.dtype):
        self.vision = vision
        self.cache = cache
        self.device, self.dtype = device, dtype

    @property
    def counters(self) -> EmbeddingCounters:
        return self.cache.counters

    def embed(self, key: int, pixels: torch.Tensor) -> torch.Tensor:
        """[feature rows, hidden] embeddings of the image named `key`, from its preprocessed pixels."""
        return self.cache.get(key, lambda: self._encode(pixels))

    def embed_step(self, images: StepImages) -> tuple[torch.Tensor, torch.Tensor] | None:
        """(token rows, embeddings) of the step's image parts, encoding only the images no cache holds."""
        embeds = embed_parts(images.parts, lambda key: self.embed(key, images.pixels[key]), self.device)
        if self.cache.publish is not None and any(p.key not in self.cache for p in images.parts):
            # an image this step needs was evicted by a later one: the workers could not resolve it
            raise ValueError(f"image_cache_mb ({self.cache.lru.capacity_bytes} bytes) holds fewer than one "
                             f"step's images ({len(images.pixels)}); raise image_cache_mb or lower "
                             "max_prefill_tokens")
        return embeds

    def _encode(self, pixels: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return self.vision.encode(pixels.to(self.device, self.dtype))
