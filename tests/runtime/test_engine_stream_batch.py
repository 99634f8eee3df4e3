"""Engine.async_stream_batch: every prompt and sample streamed at once, as the server needs."""
from __future__ import annotations

import asyncio
import time

import pytest

PARAMS = {"temperature": 0.8, "seed": 5, "n": 2, "max_new_tokens": 8}


def test_batch_stream_chunks_fold_into_generates_results_in_its_order(tiny_engine_factory):
    engine = tiny_engine_factory()
    prompts = ["first prompt", "the second one"]
    expected = engine.generate(prompts, PARAMS, return_logprob=True)

    async def collect() -> dict[int, list]:
        out: dict[int, list] = {}
        async for i, chunk in engine.async_stream_batch(prompts, PARAMS, return_logprob=True, rid=["p", "q"]):
            out.setdefault(i, []).append(chunk)
        return out

    streams = asyncio.run(collect())
    assert sorted(streams) == [0, 1, 2, 3]
    for i, chunks in streams.items():
        assert [c.finished for c in chunks] == [False] * (len(chunks) - 1) + [True]
        assert "".join(c.text for c in chunks) == expected[i].text
        assert [t for c in chunks for t in c.token_ids] == expected[i].output_ids
        assert {c.rid for c in chunks} == {["p-0", "p-1", "q-0", "q-1"][i]}
        assert all(c.prompt_tokens == expected[i].meta.prompt_tokens for c in chunks)  # counts on every chunk
        assert [c.completion_tokens for c in chunks[:-1]] == list(range(1, len(chunks)))


def test_batch_stream_validates_when_called_not_when_iterated(tiny_engine_factory):
    engine = tiny_engine_factory()
    with pytest.raises(ValueError, match="temperature"):
        engine.async_stream_batch("x", {"temperature": -1})
    with pytest.raises(TypeError, match="unexpected"):
        engine.async_stream_batch("x", None, bogus=1)


def test_closing_a_batch_stream_early_aborts_every_unfinished_sample(tiny_engine_factory):
    engine = tiny_engine_factory()
    long = {"max_new_tokens": 500, "ignore_eos": True, "n": 3}

    async def take_a_few() -> None:
        stream = engine.async_stream_batch(["a", "b"], long)
        seen = 0
        async for _ in stream:
            seen += 1
            if seen == 5:
                break
        await stream.aclose()

    asyncio.run(take_a_few())
    for _ in range(200):
        stats = engine.stats()
        if stats["running_requests"] == stats["waiting_requests"] == 0:
            break
        time.sleep(0.01)
    assert stats["aborted_requests_total"] == 6 and stats["running_requests"] == 0
    engine.check_invariants()
