"""Images a client sends (base64 data URLs or bare base64), decoded off the event loop into PIL images.
A client never names a file or URL on the server; a bad image is a 400 naming where it was."""
from __future__ import annotations

from typing import Any

from ..runtime.multimodal.inputs import load_pil
from .errors import APIError


def decode_images(sources: list[Any], params: list[str]) -> list[Any]:
    """One PIL image per source; `params[i]` names source i in an error."""
    images = []
    for source, param in zip(sources, params):
        if not isinstance(source, str):
            raise APIError(400, f"{param} must be a base64 data URL string", param)
        try:
            images.append(load_pil(source, param, allow_paths=False))
        except ValueError as e:
            raise APIError(400, str(e), param) from None
    return images


def check_vision(placeholder: str | None, model: str, param: str) -> str:
    """The model's image placeholder; a 400 when the model takes no images."""
    if placeholder is None:
        raise APIError(400, f"model {model!r} has no vision tower, so it takes no images", param)
    return placeholder
