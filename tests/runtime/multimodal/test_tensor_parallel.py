"""LLaVA under tensor parallelism on the CPU (gloo, a real worker process): TP 2 against TP 1 on the tiny
checkpoint (4 query / 2 KV heads split in two), a repeated image neither re-encoded on rank 0 nor re-sent
to the worker, and a cache too small for one step's images refused before a worker could miss one."""
from __future__ import annotations

import pytest
import torch

from radixlang.runtime.distributed.embedding_cache import BroadcastEmbeddingCache
from radixlang.runtime.engine import Engine
from radixlang.runtime.multimodal.encoder import ImageEncoder
from radixlang.runtime.multimodal.prompt import ImagePart, StepImages
from radixlang.testing.workers import inspect_embeddings

from .llava_tiny import GREEDY, IMAGE_SIZE, PATCH, PROMPT, TEXT, noise_image

ROWS = (IMAGE_SIZE // PATCH) ** 2  # feature rows (and tokens) per image
IMAGE_BYTES = ROWS * TEXT["hidden_size"] * 4  # fp32 embeddings on the CPU
TWO_IMAGES = "USER: <image> then <image>\nWhich came first? ASSISTANT:"


@pytest.fixture(scope="module")
def tp2(clip_llava):
    with Engine(str(clip_llava[0]), kv_cache_tokens=2048, tp_size=2) as e:
        yield e
        e.check_invariants()


def test_tp2_greedy_tokens_match_tp1(engine, tp2):
    images = [noise_image(21), noise_image(22, (64, 64))]
    requests = [(PROMPT, images[:1]), (TWO_IMAGES, images), (TWO_IMAGES, images[::-1])]
    for prompt, image_data in requests:
        one = engine.generate(prompt, GREEDY, image_data=image_data)
        two = tp2.generate(prompt, GREEDY, image_data=image_data)
        assert two.output_ids == one.output_ids and len(two.output_ids) == GREEDY["max_new_tokens"]
    engine.check_invariants()
    tp2.check_invariants()


def test_a_repeated_image_is_encoded_and_sent_once(tp2):
    workers = tp2.runner.workers
    image = noise_image(23)
    key = tp2.image_prompts.prepare(image).key
    encodes = tp2.image_encoder.counters.encodes
    [(_, received)] = inspect_embeddings(workers)
    first = tp2.generate(PROMPT, GREEDY, image_data=[image])
    [(entries, received_first)] = inspect_embeddings(workers)
    assert tp2.image_encoder.counters.encodes == encodes + 1 and received_first == received + IMAGE_BYTES
    assert torch.equal(entries[key], tp2.image_encoder.cache.lru.get(key))  # the worker holds rank 0's rows
    second = tp2.generate(PROMPT.replace("What is it?", "Which color?"), GREEDY, image_data=[image])
    span_end = PROMPT.index("<image>") + ROWS  # one token per byte before it
    assert first.meta.cached_tokens < span_end <= second.meta.cached_tokens
    # evicted from the radix tree, the span is prefilled again on every rank from the embedding caches
    assert tp2.flush_cache()
    third = tp2.generate(PROMPT, GREEDY, image_data=[image])
    [(_, received_third)] = inspect_embeddings(workers)
    assert third.output_ids == first.output_ids and third.meta.cached_tokens == 0
    assert tp2.image_encoder.counters.encodes == encodes + 1 and received_third == received_first
    tp2.check_invariants()


class RowsOf:
    """A stand-in vision tower: an image's pixels are its embeddings."""

    def encode(self, pixels: torch.Tensor) -> torch.Tensor:
        return pixels


def test_a_cache_smaller_than_one_steps_images_is_refused_with_a_clear_error():
    published = []
    cache = BroadcastEmbeddingCache(capacity_mb=1.5 * 16 * 2**-20, publish=lambda *entry: published.append(entry))
    encoder = ImageEncoder(RowsOf(), cache, torch.device("cpu"), torch.float32)  # room for one [2, 2] image
    images = StepImages([0] * 4, (ImagePart(1, 0, 2, 0), ImagePart(2, 0, 2, 2)),
                        {1: torch.ones(2, 2), 2: torch.zeros(2, 2)})
    with pytest.raises(ValueError, match=r"image_cache_mb .* holds fewer than one step's images \(2\)"):
        encoder.embed_step(images)  # image 2 evicted image 1, which the workers would need for this step
    assert [key for key, _, _ in published] == [1, 2] and published[1][2] == [1]
    one = StepImages([0] * 2, (ImagePart(2, 1, 1, 1),), {2: torch.zeros(2, 2)})
    rows, embeds = encoder.embed_step(one)  # one image fits: served from the cache, nothing sent
    assert rows.tolist() == [1] and torch.equal(embeds, torch.zeros(1, 2)) and len(published) == 2


def test_tp_without_an_image_cache_is_refused(clip_llava):
    with pytest.raises(ValueError, match=r"image_cache_mb must be > 0 with tp_size > 1"):
        Engine(str(clip_llava[0]), kv_cache_tokens=2048, tp_size=2, image_cache_mb=0)
