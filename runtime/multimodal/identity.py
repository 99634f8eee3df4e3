"""Image identity: a keyed xxh3_128 of the decoded pixels, and the radix keys of an image's token span.

The key is keyed with a per-engine secret, so nobody can craft an image whose key (or span) collides
with another's. Every radix key of a span is IMAGE_KEY_BASE + the full 128-bit key: such keys are
never token ids, identical images give identical runs, and two different images diverge at the
span's first key unless their 128-bit keys collide.
"""
from __future__ import annotations

import os
from typing import TYPE_CHECKING

import xxhash

if TYPE_CHECKING:
    from PIL import Image

IMAGE_KEY_BASE = 1 << 64  # above every token id and every int64; radix keys are Python ints


class ImageKeyer:
    def __init__(self, secret: bytes | None = None):
        self._secret = secret if secret is not None else os.urandom(32)

    def key(self, image: "Image.Image") -> int:
        """The 128-bit key of the image's decoded pixels, size and mode."""
        h = xxhash.xxh3_128()
        h.update(self._secret)
        h.update(f"{image.mode}:{image.size[0]}x{image.size[1]}:".encode())
        h.update(image.tobytes())
        return h.intdigest()


def span_keys(key: int, length: int) -> list[int]:
    return [IMAGE_KEY_BASE + key] * length


def is_image_key(token: int) -> bool:
    return token >= IMAGE_KEY_BASE
