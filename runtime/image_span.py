"""Where an image sits in a prompt (a leaf: the request holds these, multimodal/ makes and reads them)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True, slots=True)
class ImageSpan:
    """Positions [offset, offset + length) of a prompt hold rows [embed_offset, embed_offset + length) of
    the embeddings of the image named `key` (an image split into tiles has one span per tile)."""

    offset: int
    length: int
    key: int
    pixels: torch.Tensor  # the image's pixels, encoded only when no cache holds its embeddings
    embed_offset: int = 0

    @property
    def end(self) -> int:
        return self.offset + self.length
