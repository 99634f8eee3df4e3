"""Image inputs: a file path, encoded bytes, or a PIL image, named by an xxh3_128 hash of their content."""
from __future__ import annotations

import base64
import io
import os
from pathlib import Path
from typing import Protocol

from .ir import ImageData


class PixelImage(Protocol):
    """A PIL.Image.Image, as far as this module reads one (so PIL need not be imported)."""

    @property
    def mode(self) -> str: ...
    @property
    def size(self) -> tuple[int, int]: ...
    def tobytes(self) -> bytes: ...


# what image() takes
ImageSource = str | os.PathLike[str] | bytes | bytearray | memoryview | ImageData | PixelImage


def load_image(source: ImageSource) -> ImageData:
    """An image's data and hash. Encoded bytes hash as given; a PIL image hashes its decoded pixels."""
    if isinstance(source, ImageData):
        return source
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _make("encoded", bytes(source), None, None)
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        if not path.is_file():
            raise ValueError(f"image file {str(path)!r} does not exist")
        return _make("encoded", path.read_bytes(), None, None)
    if all(hasattr(source, a) for a in ("tobytes", "mode", "size")):  # a PIL.Image.Image, without importing PIL
        width, height = source.size
        return _make("pixels", source.tobytes(), str(source.mode), [int(width), int(height)])
    raise TypeError(f"image takes a file path, bytes or a PIL image, got {type(source).__name__}")


def _make(kind: str, data: bytes, mode: str | None, size: list[int] | None) -> ImageData:
    if not data:
        raise ValueError("image is empty")
    return ImageData(kind, data, ImageData.digest(kind, data, mode, size), mode, size)


def image_data_url(image: ImageData) -> str:
    """The image as a base64 data URL, as a server takes it: encoded bytes as they are, raw pixels as a
    lossless PNG (the server keys an image by its decoded pixels, so both name it as the engine would)."""
    data = image.data
    if image.kind == "pixels":
        from PIL import Image  # only programs that pass PIL images get here, so Pillow is there

        assert image.mode is not None and image.size is not None, "raw pixels come with their mode and size"
        width, height = image.size
        out = io.BytesIO()
        Image.frombytes(image.mode, (width, height), data).save(out, "PNG")
        data = out.getvalue()
    return "data:application/octet-stream;base64," + base64.b64encode(data).decode()
