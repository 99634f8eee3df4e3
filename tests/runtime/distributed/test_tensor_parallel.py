"""Tensor parallelism on the CPU with gloo and real worker processes: TP 2 against TP 1 on a tiny
random model whose single KV head is replicated, shapes that cannot be split, the image-embedding
broadcast cache, and a worker that dies or hangs."""
from __future__ import annotations

import os
import re
import signal
import time

import pytest
import torch

from radixlang.runtime.distributed.embedding_cache import BroadcastEmbeddingCache
from radixlang.runtime.engine import Engine
from radixlang.testing.workers import inspect_embeddings
from tests.conftest import TINY_CONFIG, tiny_weights, write_hf_folder

MQA_CONFIG = TINY_CONFIG | {"num_key_value_heads": 1}  # one KV head: each of 2 ranks holds a copy
PROMPTS = ["The capital of France is", "Once upon a time, in a land far", "The capital of France was"]
GREEDY = {"temperature": 0, "max_new_tokens": 16}


@pytest.fixture(scope="module")
def mqa_model_dir(tmp_path_factory, tokenizer):
    return write_hf_folder(tmp_path_factory.mktemp("tiny-mqa"), MQA_CONFIG, tiny_weights(MQA_CONFIG), tokenizer)


def make_engine(model_dir, **options) -> Engine:
    return Engine(model=str(model_dir), device="cpu", kv_cache_tokens=2048, **options)


@pytest.fixture(scope="module")
def tp1(mqa_model_dir):
    engine = make_engine(mqa_model_dir)
    yield engine
    engine.check_invariants()
    engine.shutdown()


@pytest.fixture(scope="module")
def tp2(mqa_model_dir):
    engine = make_engine(mqa_model_dir, tp_size=2)
    yield engine
    engine.check_invariants()
    engine.shutdown()


def _greedy_with_follow_up(engine: Engine) -> list:
    """A batch, then a prompt that extends the first prompt and its answer (a radix-cache hit)."""
    first = engine.generate(PROMPTS, GREEDY, return_logprob=True, top_logprobs_num=5)
    follow_up = engine.generate(PROMPTS[0] + first[0].text + " and", GREEDY, return_logprob=True,
                                top_logprobs_num=5)
    return [*first, follow_up]


def test_tp2_greedy_tokens_and_logprobs_equal_tp1_bit_for_bit(tp1, tp2):
    # the tiny fp32 folder runs the exact path: dense_mm linears, row-parallel ones gathered on the CPU's ranks
    runs = [_greedy_with_follow_up(e) for e in (tp1, tp2)]
    for one, two in zip(*runs):
        assert two.output_ids == one.output_ids
        for a, b in zip(one.meta.output_logprobs, two.meta.output_logprobs):
            assert (b.logprob, b.top) == (a.logprob, a.top)
    assert runs[1][-1].meta.cached_tokens > 0  # the prefix's KV came from every rank's pool
    tp1.check_invariants()
    tp2.check_invariants()


def test_embedding_broadcast_encodes_and_sends_each_key_once(tp2):
    workers = tp2.runner.workers
    cache = BroadcastEmbeddingCache(capacity_mb=24 * 2**-20 * 4 * 2, publish=workers.publish_embedding)  # 2 entries
    encodes: list[bytes] = []

    def encoder(key: bytes, value: float):
        def encode() -> torch.Tensor:
            encodes.append(key)
            return torch.full((4, 6), value)
        return encode

    first = cache.get(b"image-a", encoder(b"image-a", 1.0))
    again = cache.get(b"image-a", encoder(b"image-a", 9.0))  # a hit: the encoder is not called
    assert encodes == [b"image-a"] and torch.equal(again, first)
    assert (cache.counters.encodes, cache.counters.cache_hits, cache.counters.bytes_sent) == (1, 1, 96)
    cache.get(b"image-b", encoder(b"image-b", 2.0))
    cache.get(b"image-a", encoder(b"image-a", 9.0))  # touch a, so b is the least recently used
    cache.get(b"image-c", encoder(b"image-c", 3.0))  # evicts b on rank 0 and on the worker
    assert encodes == [b"image-a", b"image-b", b"image-c"] and cache.counters.bytes_sent == 3 * 96
    [(entries, received)] = inspect_embeddings(workers)
    assert received == 3 * 96
    assert sorted(entries) == [b"image-a", b"image-c"]
    assert torch.equal(entries[b"image-a"], first) and torch.equal(entries[b"image-c"], torch.full((4, 6), 3.0))
    tp2.check_invariants()


def test_a_broadcast_cache_refuses_an_entry_larger_than_its_capacity():
    sent = []
    cache = BroadcastEmbeddingCache(capacity_mb=10 * 2**-20, publish=lambda *entry: sent.append(entry))
    with pytest.raises(ValueError, match="more than the whole embedding cache"):
        cache.get(b"k", lambda: torch.zeros(4))
    assert sent == [] and b"k" not in cache  # nothing a worker could not mirror


def test_tp_size_that_does_not_split_the_heads_is_refused(tmp_path, tokenizer):
    cfg = TINY_CONFIG | {"hidden_size": 72, "intermediate_size": 144, "num_attention_heads": 9,
                         "num_key_value_heads": 3}  # SmolLM2's head counts
    model_dir = write_hf_folder(tmp_path / "nine-heads", cfg, tiny_weights(cfg), tokenizer)
    with pytest.raises(ValueError, match=r"tp_size 2 does not fit this model: it has 9 query heads.*one of \[1, 3, 9\]"):
        make_engine(model_dir, tp_size=2)


@pytest.mark.parametrize("options, message", [
    ({"tp_size": 0}, "tp_size must be an integer >= 1"),
    ({"tp_size": 2, "quantization": "int8"}, "quantization='int8' is not supported with tp_size > 1"),
    ({"tp_size": 2, "dist_timeout": 0}, "dist_timeout must be > 0"),
    ({"tp_size": 2, "preemption_mode": "swap"}, "preemption_mode='swap' is not supported with tp_size > 1"),
])
def test_bad_tp_options_are_refused(mqa_model_dir, options, message):
    with pytest.raises(ValueError, match=message):
        make_engine(mqa_model_dir, **options)


def _worker_pid(engine: Engine) -> int:
    [proc] = engine.runner.workers._procs
    return proc.pid


@pytest.mark.parametrize("signum, options, reason", [
    (signal.SIGKILL, {}, r"rank 1 exited with code -9"),
    (signal.SIGSTOP, {"dist_timeout": 5.0}, r"waited past dist_timeout=5.0s"),
])
def test_a_dead_or_hung_worker_stops_the_engine_with_a_clear_error(mqa_model_dir, signum, options, reason):
    engine = make_engine(mqa_model_dir, tp_size=2, **options)
    try:
        assert engine.generate(PROMPTS[0], GREEDY).meta.finish_reason == "length"
        os.kill(_worker_pid(engine), signum)
        start = time.monotonic()
        out = engine.generate(PROMPTS[1], GREEDY)
        assert out.meta.finish_reason == "abort" and re.search(reason, out.meta.error)
        assert time.monotonic() - start < 60  # no hang: the failure ends the request
        with pytest.raises(RuntimeError, match="tensor-parallel worker failure"):
            engine.generate(PROMPTS[0], GREEDY)
    finally:
        engine.shutdown()
    assert engine.runner.workers._procs == []  # every worker is gone, the hung one killed
    engine.check_invariants()
