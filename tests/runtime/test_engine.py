"""The Engine API on the tiny model: call forms, streaming, async, abort, seeds, n, and bad input."""
from __future__ import annotations

import asyncio
import threading

import pytest

GREEDY = {"temperature": 0, "max_new_tokens": 10, "ignore_eos": True}


@pytest.fixture
def engine(tiny_engine_factory):
    return tiny_engine_factory()


def test_generate_accepts_text_batch_and_ids_consistently(engine):
    single = engine.generate("Hello there", GREEDY)
    batch = engine.generate(["Hello there", "Goodbye"], GREEDY)
    by_ids = engine.generate(input_ids=engine.tokenizer.encode("Hello there"), sampling_params=GREEDY)
    assert single.output_ids == batch[0].output_ids == by_ids.output_ids
    assert single.text == engine.tokenizer.decode(single.output_ids)
    m = single.meta
    assert (m.prompt_tokens, m.completion_tokens, m.finish_reason) == (2, 10, "length")


def test_stream_concatenates_to_generate_text(engine):
    chunks = list(engine.stream("Once upon a time", GREEDY))
    assert chunks[-1].finished and all(not c.finished for c in chunks[:-1])
    assert "".join(c.text for c in chunks) == engine.generate("Once upon a time", GREEDY).text


def test_closing_a_stream_early_aborts_and_frees_kv(engine):
    stream = engine.stream("Once upon a time", {**GREEDY, "max_new_tokens": 500})
    next(stream)
    stream.close()
    engine.generate("sync point", GREEDY)  # the abort was processed before this request finished
    assert engine.stats()["running_requests"] == 0
    engine.check_invariants()


def test_async_generate_and_stream(engine):
    async def main():
        outs = await asyncio.gather(*(engine.async_generate(p, GREEDY) for p in ["a b", "c d", "e f"]))
        text = "".join([c.text async for c in engine.async_stream("a b", GREEDY)])
        return outs, text

    outs, text = asyncio.run(main())
    assert text == outs[0].text
    assert [o.output_ids for o in outs] == [o.output_ids for o in engine.generate(["a b", "c d", "e f"], GREEDY)]


def test_cancelled_async_stream_aborts_request(engine):
    async def main():
        agen = engine.async_stream("tell me a story", {**GREEDY, "max_new_tokens": 500})
        await agen.__anext__()
        await agen.aclose()

    asyncio.run(main())
    engine.generate("sync point", GREEDY)
    assert engine.stats()["aborted_requests_total"] == 1
    engine.check_invariants()


def test_abort_by_rid_from_another_thread(engine):
    result = {}
    t = threading.Thread(target=lambda: result.update(out=engine.generate(
        "long one", {**GREEDY, "max_new_tokens": 900}, rid="victim")))
    t.start()
    while engine.stats()["running_requests"] == 0:
        pass
    engine.abort("victim")
    t.join(timeout=60)
    assert result["out"].meta.finish_reason == "abort"
    assert result["out"].meta.completion_tokens < 900


def test_seed_makes_sampling_reproducible(engine):
    params = {"temperature": 1.0, "max_new_tokens": 16, "seed": 1234}
    a, b = engine.generate("The weather", params), engine.generate("The weather", params)
    c = engine.generate("The weather", {**params, "seed": 99})
    assert a.output_ids == b.output_ids != c.output_ids


def test_n_samples_share_the_prompt_kv(engine):
    outs = engine.generate("Shared prompt for samples", {"temperature": 1.0, "max_new_tokens": 8, "n": 3,
                                                          "seed": 5})
    assert len(outs) == 3 and len({tuple(o.output_ids) for o in outs}) > 1
    n = len(engine.tokenizer.encode("Shared prompt for samples"))
    assert all(o.meta.cached_tokens == n - 1 for o in outs)


def test_stop_string_and_stop_token(engine):
    free = engine.generate("Count with me", {**GREEDY, "max_new_tokens": 20})
    stop_text = free.text[5:9]
    out = engine.generate("Count with me", {**GREEDY, "max_new_tokens": 20, "stop": stop_text})
    assert out.meta.finish_reason == "stop" and out.meta.matched_stop == stop_text
    assert out.text == free.text[: free.text.index(stop_text)]
    tok = free.output_ids[3]
    out = engine.generate("Count with me", {**GREEDY, "max_new_tokens": 20, "stop_token_ids": [tok]})
    assert out.meta.matched_stop == tok and out.output_ids == free.output_ids[: free.output_ids.index(tok) + 1]


def test_min_new_tokens_blocks_stop_tokens_until_reached(engine):
    free = engine.generate("x", {**GREEDY, "max_new_tokens": 6})
    stops = free.output_ids[:3]
    out = engine.generate("x", {"temperature": 0, "max_new_tokens": 6, "min_new_tokens": 6, "stop_token_ids": stops})
    assert out.meta.completion_tokens == 6 and out.meta.finish_reason in ("stop", "length")
    assert not set(out.output_ids[:5]) & set(stops)
    early = engine.generate("x", {"temperature": 0, "max_new_tokens": 6, "stop_token_ids": stops})
    assert early.output_ids == free.output_ids[:1] and early.meta.finish_reason == "stop"


def test_output_logprobs_with_top_k(engine):
    out = engine.generate("Hello", GREEDY, return_logprob=True, top_logprobs_num=3)
    lps = out.meta.output_logprobs
    assert [lp.token_id for lp in lps] == out.output_ids
    assert all(lp.top[0][0] == lp.token_id and len(lp.top) == 3 for lp in lps)  # greedy = top-1


def test_prefill_only_request_returns_no_tokens(engine):
    out = engine.generate("Cache me", {"max_new_tokens": 0})
    assert out.output_ids == [] and out.meta.finish_reason == "length"
    again = engine.generate("Cache me please", GREEDY)
    assert again.meta.cached_tokens == len(engine.tokenizer.encode("Cache me"))


def test_max_new_tokens_is_clamped_to_the_context(tiny_engine_factory):
    engine = tiny_engine_factory(context_length=16)
    out = engine.generate(input_ids=list(range(100, 110)), sampling_params={**GREEDY, "max_new_tokens": 16})
    assert out.meta.completion_tokens == 6 and out.meta.finish_reason == "length"


def test_flush_cache_empties_the_tree(engine):
    engine.generate("something to cache", GREEDY)
    assert engine.stats()["kv_cached_tokens"] > 0
    assert engine.flush_cache()
    assert engine.stats()["kv_cached_tokens"] == 0


def test_generate_folds_exactly_the_chunks_a_stream_yields(engine):
    """generate and async_generate fold chunks on the scheduler thread; the stream, folded here, is the oracle."""
    params = {**GREEDY, "max_new_tokens": 24, "stop": [" the"]}
    kwargs = {"return_logprob": True, "logprob_start_len": 0, "top_logprobs_num": 2}
    chunks = list(engine.stream("Once upon a time", params, **kwargs))
    last = chunks[-1]
    for out in (engine.generate("Once upon a time", params, **kwargs),
                asyncio.run(engine.async_generate("Once upon a time", params, **kwargs))):
        assert out.text == "".join(c.text for c in chunks)
        assert out.output_ids == [t for c in chunks for t in c.token_ids]
        assert out.meta.output_logprobs == [lp for c in chunks for lp in c.logprobs]
        assert out.meta.input_logprobs == next(c.input_logprobs for c in chunks if c.input_logprobs is not None)
        assert (out.meta.finish_reason, out.meta.matched_stop, out.meta.completion_tokens) == \
            (last.finish_reason, last.matched_stop, last.completion_tokens)


def test_cancelled_async_generate_aborts_request(engine):
    async def main():
        task = asyncio.create_task(engine.async_generate("tell me a story", {**GREEDY, "max_new_tokens": 900}))
        while engine.stats()["running_requests"] == 0:
            await asyncio.sleep(0.001)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    engine.generate("sync point", GREEDY)
    assert engine.stats()["aborted_requests_total"] == 1
    engine.check_invariants()


def test_duplicate_rid_is_rejected_without_disturbing_the_first(engine):
    async def main():
        # the second comes once the first is in the scheduler, ~1 s before its 400 tokens are done (a fixed
        # 50 ms wait for a 40-token first lost the race in CI: it had finished, so its rid was free again)
        first = asyncio.create_task(engine.async_generate("one", {**GREEDY, "max_new_tokens": 400}, rid="same"))
        while sum(engine.stats()[k] for k in ("running_requests", "waiting_requests")) == 0:
            await asyncio.sleep(0.001)
        second = await engine.async_generate("two", GREEDY, rid="same")
        return await first, second

    first, second = asyncio.run(main())
    assert first.meta.finish_reason == "length"
    assert second.meta.finish_reason == "abort" and "already in use" in second.meta.error


def test_shutdown_aborts_requests_in_flight(tiny_engine_factory):
    engine = tiny_engine_factory()
    result = {}
    t = threading.Thread(target=lambda: result.update(out=engine.generate("x", {**GREEDY, "max_new_tokens": 900})))
    t.start()
    while engine.stats()["running_requests"] == 0:
        pass
    engine.check_invariants()
    engine.shutdown()
    t.join(timeout=60)
    assert result["out"].meta.finish_reason == "abort"
    with pytest.raises(RuntimeError, match="shut down"):
        engine.generate("x", GREEDY)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"prompt": ""}, "empty"),
        ({"input_ids": []}, "no prompts|empty"),
        ({"input_ids": [1, 2, 10**6]}, "input_ids"),
        ({"prompt": "hi", "sampling_params": {"max_tokens": 3}}, "unknown sampling field"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": -1}}, "max_new_tokens"),
        ({"prompt": "hi", "sampling_params": {"max_new_tokens": 10**9}}, "max_new_tokens"),
        ({"prompt": "hi", "sampling_params": {"temperature": -0.5}}, "temperature"),
        ({"prompt": "hi", "sampling_params": {"top_p": 0}}, "top_p"),
        ({"prompt": "hi", "sampling_params": {"top_p": 1.5}}, "top_p"),
        ({"prompt": "hi", "sampling_params": {"stop": 5}}, "stop"),
        ({"prompt": "hi", "sampling_params": {"stop": ["ok", None]}}, "stop"),
        ({"prompt": "hi", "sampling_params": {"n": 0}}, "n must"),
        ({"prompt": "hi", "sampling_params": {"seed": "x"}}, "seed"),
        ({"prompt": "hi", "top_logprobs_num": -1}, "top_logprobs_num"),
        ({"prompt": "hi " * 2000}, "context"),
    ],
)
def test_bad_input_raises_clear_value_error_and_engine_stays_healthy(engine, kwargs, match):
    with pytest.raises(ValueError, match=match):
        engine.generate(**kwargs)
    assert engine.generate("still fine", GREEDY).meta.completion_tokens == 10


def test_unknown_engine_option_is_rejected(tiny_model_dir):
    from radixlang.runtime.engine import Engine

    with pytest.raises(ValueError, match="unknown engine option"):
        Engine(str(tiny_model_dir), kv_cache_size=5)
    with pytest.raises(ValueError, match="schedule_policy"):
        Engine(str(tiny_model_dir), schedule_policy="random")
