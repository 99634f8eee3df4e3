"""The Backend protocol: what the interpreter needs from a model, in process or over HTTP.

The interpreter owns the program state (text, variables, roles); the runtime owns the KV cache.
States forked from one another share KV only through the runtime's radix cache, which is why
`cache_prefix` exists: it computes a shared prefix once before the states that extend it run.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Generator, Protocol, runtime_checkable

from .chat import ChatTemplate
from .choices import ChoiceMethod
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
    """Newly generated text; the last delta of a call carries the call's meta info. `progress` is the
    step's own meta info as SGLang streams it (completion_tokens so far and, with logprobs, this step's
    output_token_logprobs plus output_token_logprobs_length so far): `text_async_iter(...,
    return_meta_data=True)` yields it per chunk."""

    text: str
    meta: dict[str, Any] | None = None
    progress: dict[str, Any] | None = None


@runtime_checkable
class Backend(Protocol):
    def generate(self, state: StateView, gen: Gen) -> Generator[GenDelta, None, None]:
        """Streams the completion of `state.text` under `gen.params` (already merged with run defaults)."""

    def select(self, state: StateView, choices: list[str], method: str | ChoiceMethod) -> tuple[int, dict[str, Any]]:
        """Scores every choice as a continuation of `state.text`; returns (chosen index, meta info)."""

    def cache_prefix(self, text: str) -> None:
        """Computes and caches the KV of `text`, so requests that extend it reuse it."""

    def chat_template(self) -> ChatTemplate | None:
        """Role rendering for the model, or None if it has no chat template."""

    def flush_cache(self) -> bool:
        """Drops cached prefixes that are not in use."""

    def get_server_info(self) -> dict[str, Any]:
        """The model server's configuration and live counters (SGLang's get_server_info)."""


def reject_images(state: StateView, model: str) -> None:
    if state.images:
        raise ValueError(f"model {model!r} does not support images, and this program sends "
                         f"{len(state.images)}; use a vision model")
