"""Idefics3 / SmolVLM (Idefics3ForConditionalGeneration): the image is resized, split into square tiles
plus a downscaled global view, each tile goes through a SigLIP tower, then pixel shuffle and a linear
connector; the prompt gets row/column markers around each tile's feature rows."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import numpy as np
import torch
from PIL import Image
from torch import nn

from .preprocess import to_rgb
from .vision import IDEFICS3, VisionConfig, VisionTower

IDEFICS3_ARCH = "Idefics3ForConditionalGeneration"
_MAX_SIDE = 4096  # transformers' absolute bound on a resized image's longer side
_MEAN = _STD = (0.5, 0.5, 0.5)


@dataclass(frozen=True, slots=True)
class Idefics3Config:
    vision: VisionConfig
    text_hidden_size: int
    image_token_id: int
    scale_factor: int

    @classmethod
    def from_hf(cls, hf: dict[str, Any], text_hidden_size: int) -> "Idefics3Config":
        vision = VisionConfig.from_hf({**(hf.get("vision_config") or {}), "model_type": IDEFICS3})
        return cls(vision, text_hidden_size, hf.get("image_token_id", 128257), hf.get("scale_factor", 2))

    @property
    def tokens_per_tile(self) -> int:
        return (self.vision.image_size // self.vision.patch_size) ** 2 // self.scale_factor ** 2


class _Projection(nn.Module):
    def __init__(self, proj: nn.Linear):
        super().__init__()
        self.proj = proj


class _Connector(nn.Module):
    """HF's `connector.modality_projection.proj` (the weights' names)."""

    def __init__(self, proj: nn.Linear):
        super().__init__()
        self.modality_projection = _Projection(proj)


class Idefics3Vision(nn.Module):
    def __init__(self, cfg: Idefics3Config):
        super().__init__()
        self.config = cfg
        self.vision_model = VisionTower(cfg.vision)
        self.connector = _Connector(nn.Linear(cfg.vision.hidden_size * cfg.scale_factor ** 2, cfg.text_hidden_size,
                                              bias=False))

    def encode(self, tiles: torch.Tensor) -> torch.Tensor:
        """One image's tiles [T, 3, S, S] -> its [T * tokens_per_tile, hidden] features, tile by tile."""
        x = pixel_shuffle(self.vision_model.last_hidden_state(tiles), self.config.scale_factor)
        return self.connector.modality_projection.proj(x).reshape(-1, self.config.text_hidden_size)

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        from .llava import load_exact

        load_exact(self, weights)


def pixel_shuffle(x: torch.Tensor, scale: int) -> torch.Tensor:
    """[B, side*side, D] -> [B, side*side / scale^2, D * scale^2]: each scale x scale block of patches
    becomes one row, in the order transformers uses."""
    b, seq, d = x.shape
    side = int(seq ** 0.5)
    x = x.view(b, side, side // scale, d * scale).permute(0, 2, 1, 3)
    x = x.reshape(b, side // scale, side // scale, d * scale * scale).permute(0, 2, 1, 3)
    return x.reshape(b, seq // scale ** 2, d * scale * scale)


@dataclass(frozen=True, slots=True)
class SplitImageProcessor:
    """Idefics3's preprocessing: resize the longer side to `longest_edge`, round both sides up to
    multiples of the tile size, cut tiles row by row, add the whole image at tile size, then rescale and
    normalise."""

    longest_edge: int
    tile: int
    resample: Image.Resampling = Image.Resampling.LANCZOS
    rescale_factor: float | None = 1 / 255
    mean: tuple[float, ...] | None = _MEAN
    std: tuple[float, ...] | None = _STD
    do_resize: bool = True
    split: bool = True

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "SplitImageProcessor":
        normalize = d.get("do_normalize", True)
        return cls(
            longest_edge=int((d.get("size") or {}).get("longest_edge", 4 * 364)),
            tile=int((d.get("max_image_size") or {}).get("longest_edge", 364)),
            resample=Image.Resampling(d.get("resample", Image.Resampling.LANCZOS)),
            rescale_factor=float(d.get("rescale_factor", 1 / 255)) if d.get("do_rescale", True) else None,
            mean=tuple(d.get("image_mean", _MEAN)) if normalize else None,
            std=tuple(d.get("image_std", _STD)) if normalize else None,
            do_resize=bool(d.get("do_resize", True)),
            split=bool(d.get("do_image_splitting", True)),
        )

    def __call__(self, image: Image.Image) -> tuple[torch.Tensor, int, int]:
        """([tiles, 3, S, S] float32 pixels, rows, cols); rows = cols = 0: one tile, no split."""
        rgb = to_rgb(image)
        if self.do_resize:
            rgb = rgb.resize(_longest_edge_size(*rgb.size, self.longest_edge), resample=self.resample)
        if not self.split:
            return self._normalize([rgb.resize((self.tile, self.tile), resample=self.resample)]), 0, 0
        rgb = rgb.resize(_tile_multiple_size(*rgb.size, self.tile), resample=self.resample)
        width, height = rgb.size
        if width <= self.tile and height <= self.tile:
            return self._normalize([rgb]), 0, 0
        rows, cols = height // self.tile, width // self.tile
        tiles = [rgb.crop((c * self.tile, r * self.tile, (c + 1) * self.tile, (r + 1) * self.tile))
                 for r in range(rows) for c in range(cols)]
        tiles.append(rgb.resize((self.tile, self.tile), resample=self.resample))
        return self._normalize(tiles), rows, cols

    def _normalize(self, tiles: list[Image.Image]) -> torch.Tensor:
        out = np.stack([np.asarray(t).transpose(2, 0, 1) for t in tiles])
        out = (out.astype(np.float64) * self.rescale_factor if self.rescale_factor is not None else out)
        out = out.astype(np.float32)
        if self.mean is not None:
            out = (out - np.asarray(self.mean, np.float32)[:, None, None]) / np.asarray(self.std, np.float32)[:, None, None]
        return torch.from_numpy(np.ascontiguousarray(out))


def _longest_edge_size(width: int, height: int, longest: int) -> tuple[int, int]:
    """(width, height) with the longer side at `longest`, the other even, then under _MAX_SIDE."""
    ratio = width / height
    if width >= height:
        width, height = longest, int(longest / ratio)
        height += height % 2
    else:
        height, width = longest, int(longest * ratio)
        width += width % 2
    width, height = max(width, 1), max(height, 1)
    ratio = width / height
    if width >= height and width > _MAX_SIDE:
        width, height = _MAX_SIDE, int(_MAX_SIDE / ratio)
    elif height > width and height > _MAX_SIDE:
        height, width = _MAX_SIDE, int(_MAX_SIDE * ratio)
    return max(width, 1), max(height, 1)


def _tile_multiple_size(width: int, height: int, tile: int) -> tuple[int, int]:
    ratio = width / height
    if width >= height:
        width = math.ceil(width / tile) * tile
        height = math.ceil(int(width / ratio) / tile) * tile
    else:
        height = math.ceil(height / tile) * tile
        width = math.ceil(int(height * ratio) / tile) * tile
    return width, height


def prompt_text(rows: int, cols: int, tokens_per_tile: int, image_token: str) -> str:
    """What replaces one image's placeholder: each tile's row/column marker and feature rows, then the
    global view's."""
    fake, image = "<fake_token_around_image>", image_token * tokens_per_tile
    global_view = f"{fake}<global-img>{image}{fake}"
    if rows == 0 and cols == 0:
        return global_view
    grid = "".join("".join(f"{fake}<row_{r + 1}_col_{c + 1}>{image}" for c in range(cols)) + "\n"
                   for r in range(rows))
    return grid + "\n" + global_view


def make_prepare(processor: SplitImageProcessor, cfg: Idefics3Config, placeholder: str,
                 encode: Callable[[str], list[int]]) -> Callable[[Image.Image], tuple[torch.Tensor, list[int]]]:
    """An image -> (its tiles, the tokens that replace its placeholder); token runs cached per grid."""
    cache: dict[tuple[int, int], list[int]] = {}

    def prepare(image: Image.Image) -> tuple[torch.Tensor, list[int]]:
        tiles, rows, cols = processor(image)
        if (rows, cols) not in cache:
            cache[rows, cols] = encode(prompt_text(rows, cols, cfg.tokens_per_tile, placeholder))
        return tiles, cache[rows, cols]

    return prepare


def split_idefics3_weights(weights: Iterable[tuple[str, torch.Tensor]]):
    """HF Idefics3 tensor names -> (language model, vision) pairs."""
    text, vision = [], []
    for name, tensor in weights:
        stem = name.removeprefix("model.")
        if stem.startswith("text_model."):
            text.append((stem.removeprefix("text_model."), tensor))
        elif name == "lm_head.weight":
            text.append((name, tensor))
        elif stem.startswith(("vision_model.", "connector.")):
            vision.append((stem, tensor))
        else:
            raise ValueError(f"unexpected Idefics3 weight {name!r}")
    return text, vision
