"""The Backend protocol: what the interpreter needs from a model, in process or over HTTP.

The interpreter owns the program state (text, variables, roles); the runtime owns the KV cache.
States forked from one another share KV only through the runtime's radix cache, which is why
`cache_prefix` exists: it computes a shared prefix once before the states that extend it run.
"""
from __future__ import annotations

import sys
import threading
from dataclasses import dataclass
from typing import Any, Iterator, Protocol, runtime_checkable

from .chat import ChatTemplate
from .ir import Gen, ImageData

PREFILL_ONLY = {"max_new_tokens": 0}  # sampling params that compute a prompt's KV (and logprobs) and stop


@dataclass(frozen=True, slots=True)
class StateView:
    """What a backend sees of a program state: its text so far and the images in it, each at its offset
    in the text (the image comes before the character there)."""

    text: str
    images: tuple[ImageData, ...] = ()
    image_offsets: tuple[int, ...] = ()
    # the program state asking, as "program:<run>/<state>": a backend may keep its KV cached while the
    # run goes on (`release_program(<run> group)` at its end); None: nobody will come back for it
    owner: str | None = None

    def with_placeholders(self, placeholder: str) -> str:
        """The text with `placeholder` (a model's image token) where each image goes."""
        parts, prev = [], 0
        for offset in self.image_offsets:
            parts += [self.text[prev:offset], placeholder]
            prev = offset
        return "".join(parts) + self.text[prev:]


@dataclass(slots=True)
class GenDelta:
    """Newly generated text; the last delta of a call carries the call's meta info."""

    text: str
    meta: dict[str, Any] | None = None


@runtime_checkable
class Backend(Protocol):
    def generate(self, state: StateView, gen: Gen) -> Iterator[GenDelta]:
        """Streams the completion of `state.text` under `gen.params` (already merged with run defaults)."""

    def select(self, state: StateView, choices: list[str], method: Any) -> tuple[int, dict[str, Any]]:
        """Scores every choice as a continuation of `state.text`; returns (chosen index, meta info)."""

    def cache_prefix(self, text: str) -> None:
        """Computes and caches the KV of `text`, so requests that extend it reuse it."""

    def chat_template(self) -> ChatTemplate | None:
        """Role rendering for the model, or None if it has no chat template."""

    def flush_cache(self) -> bool:
        """Drops cached prefixes that are not in use."""


def reject_images(state: StateView, model: str) -> None:
    if state.images:
        raise ValueError(f"model {model!r} does not support images, and this program sends "
                         f"{len(state.images)}; use a vision model")


_default: Backend | None = None
_default_lock = threading.Lock()


def set_default_backend(backend: Any) -> None:
    """The backend `run` uses when none is passed: a Runtime, Endpoint, Engine or any Backend."""
    global _default
    wrapped = as_backend(backend)
    with _default_lock:
        _default = wrapped


def as_backend(backend: Any) -> Backend:
    """A Backend from a backend, an in-process Engine, or None (the default backend)."""
    if backend is None:
        with _default_lock:
            if _default is None:
                raise ValueError("no backend: pass backend=... or call set_default_backend(...) first")
            return _default
    engine_module = sys.modules.get("radixlang.runtime.engine")
    if engine_module is not None and isinstance(backend, engine_module.Engine):
        from .engine_backend import EngineBackend

        return EngineBackend(backend)
    if not isinstance(backend, Backend):
        raise TypeError(f"backend must be a Runtime, Endpoint, Engine or Backend, got {type(backend).__name__}")
    return backend
