"""Images a client sends (base64 data URLs or bare base64), decoded (and, for the engine, keyed and
preprocessed) off the event loop. A client never names a file or URL on the server; a bad image is a
400 naming where it was."""
from __future__ import annotations

from typing import Any, Callable

from ..runtime.multimodal.inputs import load_pil
from ..runtime.multimodal.prompt import ImagePrompts, PreparedImage
from .errors import APIError


def prepare_images(prompts: ImagePrompts | None, model: str, sources: list[Any],
                   params: list[str]) -> list[PreparedImage]:
    """What the engine takes for each source; `params[i]` names source i in an error. Slow on large
    images: call it on a worker thread."""
    if prompts is None:
        if sources:
            raise APIError(400, f"model {model!r} has no vision tower, so it takes no images", params[0])
        return []
    return _convert(sources, params, lambda source, param: prompts.prepare(source, param, allow_paths=False))


def decode_images(sources: list[Any], params: list[str]) -> list[Any]:
    """A PIL image for each source (for a program's image arguments)."""
    return _convert(sources, params, lambda source, param: load_pil(source, param, allow_paths=False))


def _convert(sources: list[Any], params: list[str], convert: Callable[[str, str], Any]) -> list[Any]:
    out = []
    for source, param in zip(sources, params):
        if not isinstance(source, str):
            raise APIError(400, f"{param} must be a base64 data URL string", param)
        try:
            out.append(convert(source, param))
        except ValueError as e:
            raise APIError(400, str(e), param) from None
    return out
