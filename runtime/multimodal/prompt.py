"""Prompts with images: each placeholder token becomes a span of radix keys derived from the image's key,
and each step's model input takes those spans' embeddings in place of token embeddings."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Sequence

import torch

from ..image_span import ImageSpan
from .identity import ImageKeyer, is_image_key, span_keys

if TYPE_CHECKING:
    from ..batch import StepBatch
    from .loader import VisionModel


@dataclass(frozen=True, slots=True)
class PreparedImage:
    """An image decoded, keyed and preprocessed: what a prompt's span needs (a server prepares images off
    its event loop and hands these to the engine)."""

    key: int
    pixels: torch.Tensor
    tokens: tuple[int, ...]  # what replaces the placeholder: the image token id where each feature row goes


class ImagePrompts:
    """Turns (token ids with placeholders, image sources) into radix keys and image spans."""

    def __init__(self, vision: "VisionModel", keyer: ImageKeyer | None = None):
        self.vision = vision
        self.keyer = keyer or ImageKeyer()

    @property
    def placeholder(self) -> str:
        return self.vision.placeholder

    def prepare(self, source: object, where: str = "image", allow_paths: bool = True) -> PreparedImage:
        if isinstance(source, PreparedImage):
            return source
        from .inputs import load_pil  # Pillow only when an image arrives: text models start without it

        image = load_pil(source, where, allow_paths)
        pixels, tokens = self.vision.prepare(image)
        return PreparedImage(self.keyer.key(image), pixels, tuple(tokens))

    def expand(self, ids: Sequence[int], sources: Sequence[object], where: str = "image_data",
               allow_paths: bool = True, logprob_start: int = -1) -> tuple[list[int], list[ImageSpan], int]:
        """The prompt with each placeholder replaced by its image's tokens (feature positions as radix
        keys), the image spans, and `logprob_start` (a position in the prompt as given) in the expanded
        prompt: prompt logprobs score text only."""
        slots = [i for i, t in enumerate(ids) if t == self.vision.image_token_id]
        if len(slots) != len(sources):
            raise ValueError(f"the prompt has {len(slots)} image placeholder(s) {self.placeholder!r} but "
                             f"{len(sources)} image(s) were given; put one placeholder where each image goes")
        if slots and logprob_start >= 0 and slots[-1] >= logprob_start:
            raise ValueError(f"logprob_start_len {logprob_start} would score image tokens; it must be -1 or "
                             f"past the last image placeholder (at least {slots[-1] + 1})")
        out: list[int] = []
        spans: list[ImageSpan] = []
        prev = 0
        for j, (slot, source) in enumerate(zip(slots, sources)):
            image = self.prepare(source, f"{where}[{j}]", allow_paths)
            out += ids[prev:slot]
            spans += self._spans(image, len(out))
            out += [self._key_or_token(t, image.key) for t in image.tokens]
            prev = slot + 1
        shift = len(out) - prev  # every placeholder is before logprob_start
        return out + list(ids[prev:]), spans, logprob_start + shift if logprob_start >= 0 else logprob_start

    def _key_or_token(self, token: int, key: int) -> int:
        return span_keys(key, 1)[0] if token == self.vision.image_token_id else token

    def _spans(self, image: PreparedImage, offset: int) -> list[ImageSpan]:
        """One span per run of feature positions in the image's tokens."""
        spans, rows, start = [], 0, None
        for i, token in enumerate((*image.tokens, None)):
            if token == self.vision.image_token_id and start is None:
                start = i
            elif token != self.vision.image_token_id and start is not None:
                spans.append(ImageSpan(offset + start, i - start, image.key, image.pixels, rows))
                rows, start = rows + i - start, None
        return spans


def text_ids(ids: Sequence[int]) -> list[int]:
    """The token ids of a prompt without its image spans."""
    return [t for t in ids if not is_image_key(t)]


@dataclass(frozen=True, slots=True)
class ImagePart:
    """Step tokens [at, at + count) take rows [first, first + count) of the embeddings of image `key`:
    a reference small enough to send to every tensor-parallel rank in place of the embeddings."""

    key: int
    first: int
    count: int
    at: int


@dataclass(slots=True)
class StepImages:
    input_ids: list[int]  # the step's token ids, each image key replaced by the image token id
    parts: tuple[ImagePart, ...]
    pixels: dict[int, torch.Tensor]  # each part's image's pixels, for an encoder that misses its cache


def step_images(batch: "StepBatch", image_token_id: int) -> StepImages:
    """The step's token ids and the image parts whose embeddings replace image tokens' embeddings: only
    the images (and rows of them) this step reaches."""
    ids: list[int] = []
    parts: list[ImagePart] = []
    pixels: dict[int, torch.Tensor] = {}
    for item in batch.items:
        base = len(ids)
        ids += [image_token_id if is_image_key(t) else t for t in item.req.tokens(item.start, item.end)]
        for span in item.req.images:
            lo, hi = max(span.offset, item.start), min(span.end, item.end)
            if lo < hi:
                parts.append(ImagePart(span.key, span.embed_offset + lo - span.offset, hi - lo, base + lo - item.start))
                pixels[span.key] = span.pixels
    return StepImages(ids, tuple(parts), pixels)


def embed_parts(parts: Sequence[ImagePart], embeddings: Callable[[int], torch.Tensor],
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor] | None:
    """(token rows, embeddings) for the model's `embeds`, each part's rows sliced from `embeddings(key)`
    (rank 0's encoder, or a worker's mirror); None when the step has no image tokens."""
    if not parts:
        return None
    rows = torch.cat([torch.arange(p.at, p.at + p.count, dtype=torch.int64) for p in parts]).to(device)
    return rows, torch.cat([embeddings(p.key)[p.first:p.first + p.count] for p in parts])
