"""Pixels as a vision tower wants them, following the folder's preprocessor_config.json: convert to RGB,
resize, center-crop, rescale, normalise (as transformers' PIL image processors do, in the same order and
precision). Patchifying is the vision tower's strided convolution."""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

_CLIP_MEAN, _CLIP_STD = (0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)


@dataclass(frozen=True, slots=True)
class ImageProcessor:
    size: dict[str, int]  # {"shortest_edge": n} or {"height": h, "width": w}
    crop: tuple[int, int] | None  # (height, width) of the center crop; None: no crop
    resample: Image.Resampling = Image.Resampling.BICUBIC
    rescale_factor: float | None = 1 / 255  # None: no rescale
    mean: tuple[float, ...] | None = _CLIP_MEAN  # None: no normalisation
    std: tuple[float, ...] | None = _CLIP_STD
    do_resize: bool = True

    @classmethod
    def from_folder(cls, path: Path) -> "ImageProcessor":
        return cls.from_dict(read_preprocessor_config(path))

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "ImageProcessor":
        crop = _hw(d.get("crop_size")) if d.get("do_center_crop", False) else None
        size = d.get("size", {"shortest_edge": 224})
        if isinstance(size, int):  # legacy configs: an int is the shortest edge when a crop follows, else a square
            size = {"shortest_edge": size} if crop else {"height": size, "width": size}
        if not ("shortest_edge" in size or {"height", "width"} <= set(size)):
            raise ValueError(f"preprocessor_config.json size {size!r} is not supported "
                             "(expected shortest_edge, or height and width)")
        return cls(
            size=dict(size),
            crop=crop,
            resample=Image.Resampling(d.get("resample", Image.Resampling.BICUBIC)),
            rescale_factor=float(d.get("rescale_factor", 1 / 255)) if d.get("do_rescale", True) else None,
            mean=tuple(d.get("image_mean", _CLIP_MEAN)) if d.get("do_normalize", True) else None,
            std=tuple(d.get("image_std", _CLIP_STD)) if d.get("do_normalize", True) else None,
            do_resize=bool(d.get("do_resize", True)),
        )

    def output_size(self) -> tuple[int, int]:
        """(height, width) of every processed image."""
        if self.crop is not None:
            return self.crop
        if "height" in self.size:
            return self.size["height"], self.size["width"]
        raise ValueError("a shortest_edge resize without a center crop gives images of varying size")

    def __call__(self, image: Image.Image) -> torch.Tensor:
        """[3, H, W] float32 pixel values."""
        rgb = to_rgb(image)
        if self.do_resize:
            rgb = rgb.resize(self._resized_wh(rgb.size), resample=self.resample)
        pixels = np.asarray(rgb).transpose(2, 0, 1)  # CHW uint8
        if self.crop is not None:
            pixels = center_crop(pixels, *self.crop)
        out = pixels.astype(np.float64) * self.rescale_factor if self.rescale_factor is not None else pixels
        out = out.astype(np.float32)
        if self.mean is not None:
            mean = np.asarray(self.mean, dtype=np.float32)[:, None, None]
            std = np.asarray(self.std, dtype=np.float32)[:, None, None]
            out = (out - mean) / std
        return torch.from_numpy(np.ascontiguousarray(out))

    def _resized_wh(self, wh: tuple[int, int]) -> tuple[int, int]:
        if "shortest_edge" not in self.size:
            return self.size["width"], self.size["height"]
        width, height = wh
        short, long = min(width, height), max(width, height)
        new_short, new_long = self.size["shortest_edge"], int(self.size["shortest_edge"] * long / short)
        return (new_short, new_long) if width <= height else (new_long, new_short)


def read_preprocessor_config(path: Path) -> dict[str, Any]:
    """The image processor's settings: preprocessor_config.json, or (transformers 5 saves a processor so) the
    `image_processor` entry of processor_config.json."""
    file = path / "preprocessor_config.json"
    if file.exists():
        return json.loads(file.read_text())
    processor = path / "processor_config.json"
    if processor.exists():
        settings = json.loads(processor.read_text()).get("image_processor")
        if isinstance(settings, dict):
            return settings
    raise ValueError(f"vision model folder {str(path)!r} has no preprocessor_config.json, nor an "
                     "image_processor entry in processor_config.json")


def to_rgb(image: Image.Image) -> Image.Image:
    """RGB, with any transparency composited onto white (as transformers does)."""
    if "A" in image.getbands() or image.info.get("transparency") is not None:
        background = Image.new("RGBA", image.size, (255, 255, 255, 255))
        return Image.alpha_composite(background, image.convert("RGBA")).convert("RGB")
    return image.convert("RGB")


def center_crop(pixels: np.ndarray, height: int, width: int) -> np.ndarray:
    """The centre [.., height, width] window; zero padding (centred) where the image is smaller."""
    h, w = pixels.shape[-2:]
    if h < height or w < width:
        padded = np.zeros(pixels.shape[:-2] + (max(h, height), max(w, width)), dtype=pixels.dtype)
        top, left = -(-(padded.shape[-2] - h) // 2), -(-(padded.shape[-1] - w) // 2)
        padded[..., top:top + h, left:left + w] = pixels
        pixels, h, w = padded, padded.shape[-2], padded.shape[-1]
    top, left = (h - height) // 2, (w - width) // 2
    return pixels[..., top:top + height, left:left + width]


def _hw(crop: object) -> tuple[int, int]:
    if isinstance(crop, int):
        return crop, crop
    if isinstance(crop, dict) and {"height", "width"} <= set(crop):
        return int(crop["height"]), int(crop["width"])
    raise ValueError(f"preprocessor_config.json crop_size {crop!r} is not supported (expected height and width)")
