"""Limits and defaults of image inputs: the one place they live."""
from __future__ import annotations

# A decoded image over this many pixels is refused before its pixels are decoded (decompression bombs);
# 8K x 4K fits, and Pillow's own warning threshold (~89M) is never reached
MAX_IMAGE_PIXELS = 40_000_000
MAX_IMAGE_BYTES = 32 * 1024 * 1024  # encoded size of one image
