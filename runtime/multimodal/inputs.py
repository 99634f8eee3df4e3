"""Image sources -> decoded, validated PIL images: file paths, bytes, base64 / data URLs, PIL images,
and the language's ImageData. Every way a source can be bad ends in a ValueError naming it."""
from __future__ import annotations

import base64
import binascii
import io
import os
import warnings
from pathlib import Path
from typing import Protocol, TypeGuard

from PIL import Image, UnidentifiedImageError

from .config import MAX_IMAGE_BYTES, MAX_IMAGE_PIXELS

_DATA_URL = "data:"


class ImageBytes(Protocol):
    """The language's ImageData (lang/ir.py), read by its fields (lang sits above the runtime)."""

    @property
    def kind(self) -> str: ...  # "pixels" (raw, with mode and size) or "encoded" (a file's bytes)
    @property
    def data(self) -> bytes: ...
    @property
    def mode(self) -> str | None: ...
    @property
    def size(self) -> list[int] | None: ...


def load_pil(source: object, where: str = "image", allow_paths: bool = True) -> Image.Image:
    """A fully decoded PIL image. `allow_paths=False` refuses file paths (an HTTP client must not name
    files on the server)."""
    if isinstance(source, Image.Image):
        _check_pixels(source.size, where)
        return source
    if _is_image_data(source):
        if source.kind == "pixels":
            return _from_pixels(source.data, source.mode, source.size, where)
        return _decode(source.data, where)
    if isinstance(source, (bytes, bytearray, memoryview)):
        return _decode(bytes(source), where)
    if isinstance(source, str) and (source.startswith(_DATA_URL) or not allow_paths):
        return _decode(decode_base64(source, where), where)
    if isinstance(source, (str, os.PathLike)):
        return _decode(_read_file(Path(source), where), where)
    raise TypeError(f"{where} must be a file path, bytes, a base64 data URL or a PIL image, "
                    f"got {type(source).__name__}")


def decode_base64(text: str, where: str) -> bytes:
    """The bytes of a `data:image/...;base64,...` URL or of bare base64 text."""
    if text.startswith(_DATA_URL):
        header, sep, text = text.partition(",")
        if not sep or not header.endswith(";base64"):
            raise ValueError(f"{where} is a data URL without ';base64,' (only base64 data URLs are supported)")
    if text.startswith(("http://", "https://")):
        raise ValueError(f"{where} is an http(s) URL; this server fetches nothing, so send the image as a "
                         "base64 data URL")
    if len(text) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise ValueError(f"{where} is over {MAX_IMAGE_BYTES} bytes")
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        raise ValueError(f"{where} is neither a base64 data URL nor base64 image data") from None


def _is_image_data(source: object) -> TypeGuard[ImageBytes]:
    return all(hasattr(source, a) for a in ("kind", "data", "hash", "mode", "size"))


def _read_file(path: Path, where: str) -> bytes:
    try:
        exists = path.is_file()
    except OSError:  # e.g. a name too long to be a path
        exists = False
    if not exists:
        raise ValueError(f"{where}: image file {str(path)!r} does not exist")
    if path.stat().st_size > MAX_IMAGE_BYTES:
        raise ValueError(f"{where}: image file {str(path)!r} is over {MAX_IMAGE_BYTES} bytes")
    return path.read_bytes()


def _check_pixels(size: tuple[int, int], where: str) -> None:
    width, height = size
    if width < 1 or height < 1:
        raise ValueError(f"{where} has no pixels ({width}x{height})")
    if width * height > MAX_IMAGE_PIXELS:
        raise ValueError(f"{where} is {width}x{height} = {width * height} pixels, over the {MAX_IMAGE_PIXELS} "
                         "pixels at most decoded (a decompression bomb?)")


def _decode(data: bytes, where: str) -> Image.Image:
    if not data:
        raise ValueError(f"{where} is empty")
    if len(data) > MAX_IMAGE_BYTES:
        raise ValueError(f"{where} is over {MAX_IMAGE_BYTES} bytes")
    try:
        with warnings.catch_warnings():  # sizes over our limit are refused below, Pillow need not warn
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))  # reads the header only: the size is checked before decoding
    except UnidentifiedImageError:
        raise ValueError(f"{where} is not an image Pillow can decode ({len(data)} bytes)") from None
    except Image.DecompressionBombError as e:  # Pillow's own, far higher limit
        raise ValueError(f"{where} is over the {MAX_IMAGE_PIXELS} pixels at most decoded "
                         f"(a decompression bomb?): {e}") from None
    _check_pixels(image.size, where)
    try:
        image.load()
    except (OSError, SyntaxError, ValueError) as e:
        raise ValueError(f"{where} is truncated or corrupt ({image.format}): {e}") from None
    return image


def _from_pixels(data: bytes, mode: str | None, size: list[int] | None, where: str) -> Image.Image:
    if mode is None or size is None or len(size) != 2:
        raise ValueError(f"{where}: raw pixels need a mode and a [width, height] size")
    _check_pixels((size[0], size[1]), where)
    try:
        return Image.frombytes(mode, (size[0], size[1]), data)
    except ValueError as e:
        raise ValueError(f"{where}: {len(data)} bytes are not {size[0]}x{size[1]} pixels of mode {mode!r}: {e}") \
            from None
