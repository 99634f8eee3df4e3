"""prompt_cache_key sessions on the engine: the finished sequence stays pinned through pressure that
evicts everything else, a new request of the key refreshes it, and abort, TTL and release drop it."""
from __future__ import annotations

import time

import pytest

GREEDY = {"temperature": 0, "max_new_tokens": 4, "ignore_eos": True}
POOL = 1024


def words(seed: int, n: int) -> str:
    """A prompt of about n tokens that shares nothing with another seed's."""
    return " ".join(f"w{seed}x{i}" for i in range(n // 3))


def flood(engine, n: int = 8) -> None:
    """Unique one-shot prompts (~280 tokens each: each fits beside a pin) whose KV together is twice the
    pool: all unpinned KV goes."""
    engine.generate([words(100 + i, 120) for i in range(n)], GREEDY)


def test_a_session_survives_pressure_that_evicts_everything_else(tiny_engine_factory):
    engine = tiny_engine_factory(kv_cache_tokens=POOL, kv_host_cache_tokens=0)  # evicted means gone
    history = words(1, 240)
    first = engine.generate(history, GREEDY, cache_key="agent-1")
    unkeyed = words(2, 240)
    engine.generate(unkeyed, GREEDY)
    assert engine.stats()["kv_pins"] == 1
    flood(engine)
    turn2 = engine.generate(history + first.text + " and then", GREEDY, cache_key="agent-1")
    assert turn2.meta.cached_tokens >= first.meta.prompt_tokens  # the whole first turn came back from cache
    again = engine.generate(unkeyed + " and then", GREEDY)
    assert again.meta.cached_tokens < 5  # the control without a key was evicted (all but the pinned "w")
    stats = engine.stats()
    assert stats["pins_released_under_pressure_total"] == 0 and stats["kv_pinned_tokens"] <= POOL // 2


def test_a_queued_request_keeps_its_cached_prefix_under_pressure(tiny_engine_factory):
    """No key, no pin: the prefix is the least recently used, yet the request queued behind a flood (first
    come, first served, two at a time) still finds it, because what a queued request will hit goes last."""
    engine = tiny_engine_factory(kv_cache_tokens=POOL, kv_host_cache_tokens=0, schedule_policy="fcfs",
                                 max_running_requests=2)
    prefix = words(8, 240)
    first = engine.generate(prefix, GREEDY)
    outs = engine.generate([words(100 + i, 120) for i in range(8)] + [prefix + " and then"], GREEDY)
    assert outs[-1].meta.cached_tokens >= first.meta.prompt_tokens - 1
    engine.check_invariants()
    assert engine.generate(words(100, 120), GREEDY).meta.cached_tokens < 5  # the pressure was real: evicted


def test_abort_of_a_keyed_request_releases_its_session(tiny_engine_factory):
    engine = tiny_engine_factory(kv_cache_tokens=POOL, kv_host_cache_tokens=0)
    engine.generate(words(3, 120), GREEDY, cache_key="s")
    assert engine.stats()["kv_pins"] == 1
    stream = engine.stream(words(3, 120) + " more", {"temperature": 0, "max_new_tokens": 200}, cache_key="s")
    next(stream)
    stream.close()  # the caller went away mid-request: an abort
    engine.check_invariants()
    stats = engine.stats()
    assert stats["kv_pins"] == 0 and stats["kv_pinned_tokens"] == 0
    flood(engine)
    assert engine.generate(words(3, 120) + " more", GREEDY).meta.cached_tokens < 5  # back in the LRU, evicted


def test_retention_ends_after_its_ttl(tiny_engine_factory):
    engine = tiny_engine_factory(kv_cache_tokens=POOL, prompt_cache_retention=0.3)
    out = engine.generate(words(4, 90), GREEDY, cache_key="s")
    stats = engine.stats()
    assert stats["kv_pins"] == 1 and stats["kv_pinned_tokens"] == out.meta.prompt_tokens + 3  # prompt + KV'd output
    time.sleep(0.5)
    stats = engine.stats()
    assert stats["kv_pins"] == 0 and stats["pins_expired_total"] == 1
    assert stats["kv_cached_tokens"] > 0  # released to the LRU, not dropped


def test_same_key_moves_the_pin_and_release_drops_it(tiny_engine_factory):
    engine = tiny_engine_factory(kv_cache_tokens=POOL)
    a = engine.generate(words(5, 60), GREEDY, cache_key="s")
    b = engine.generate(words(5, 60) + a.text + " next", GREEDY, cache_key="s")
    stats = engine.stats()
    assert stats["kv_pins"] == 1 and stats["kv_pinned_tokens"] == b.meta.prompt_tokens + 3
    assert engine.release_cache_key("s") == b.meta.prompt_tokens + 3
    assert engine.release_cache_key("s") == 0
    assert engine.stats()["kv_pinned_tokens"] == 0


def test_the_pinned_budget_is_never_exceeded(tiny_engine_factory):
    engine = tiny_engine_factory(kv_cache_tokens=POOL, max_pinned_fraction=0.25)
    for i in range(6):
        engine.generate(words(10 + i, 120), GREEDY, cache_key=f"s{i}")
        stats = engine.stats()
        assert stats["kv_pinned_tokens"] <= POOL // 4
    assert stats["kv_pins"] < 6 and stats["pins_released_under_pressure_total"] >= 1


def test_the_host_tier_is_on_by_default_at_two_pools(tiny_engine_factory):
    engine = tiny_engine_factory(kv_cache_tokens=POOL)
    prompt = words(7, 240)
    first = engine.generate(prompt, GREEDY)
    flood(engine)
    again = engine.generate(prompt, GREEDY)
    assert again.meta.cached_tokens == first.meta.prompt_tokens - 1  # copied back, not recomputed
    assert engine.scheduler.kv.host.num_slots == 2 * POOL
    assert tiny_engine_factory(kv_cache_tokens=POOL, disable_radix_cache=True).scheduler.kv.host is None


def test_bad_retention_options_are_refused_naming_the_field(tiny_engine_factory):
    with pytest.raises(ValueError, match="max_pinned_fraction"):
        tiny_engine_factory(max_pinned_fraction=1.5)
    with pytest.raises(ValueError, match="prompt_cache_retention"):
        tiny_engine_factory(prompt_cache_retention=-1)
    with pytest.raises(ValueError, match="kv_host_cache_tokens"):
        tiny_engine_factory(kv_host_cache_tokens=-1)
    engine = tiny_engine_factory()
    with pytest.raises(ValueError, match="prompt_cache_key"):
        engine.generate("hi", GREEDY, cache_key="")


def test_a_host_tier_restore_gives_the_tokens_and_logprobs_of_a_recompute(tiny_engine_factory):
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    prompt = words(6, 240)
    hosted = tiny_engine_factory(kv_cache_tokens=POOL, kv_host_cache_tokens=4096)
    fresh = hosted.generate(prompt, params, return_logprob=True, top_logprobs_num=5)
    flood(hosted)  # the prompt's KV leaves the device pool for the host tier
    assert hosted.stats()["host_cache_tokens"] >= fresh.meta.prompt_tokens
    restored = hosted.generate(prompt, params, return_logprob=True, top_logprobs_num=5)
    stats = hosted.stats()
    assert restored.meta.cached_tokens == fresh.meta.prompt_tokens - 1  # all but the last token, copied back
    assert stats["host_restored_tokens_total"] >= restored.meta.cached_tokens - 5  # the flood kept "w" on device
    assert stats["recomputed_cached_tokens_total"] == 0
    assert restored.output_ids == fresh.output_ids
    for a, b in zip(fresh.meta.output_logprobs, restored.meta.output_logprobs, strict=True):
        assert [t for t, _ in a.top] == [t for t, _ in b.top]
        assert [v for _, v in a.top] == pytest.approx([v for _, v in b.top], abs=1e-4)
    plain = tiny_engine_factory(kv_cache_tokens=POOL, kv_host_cache_tokens=0)  # the control: no host tier
    plain.generate(prompt, params)
    flood(plain)
    again = plain.generate(prompt, params)
    assert again.meta.cached_tokens < 5 and again.output_ids == fresh.output_ids
    assert plain.stats()["recomputed_cached_tokens_total"] >= fresh.meta.prompt_tokens - 5


def test_a_flush_forgets_what_was_evicted_before_it(tiny_engine_factory):
    """"Recomputed, was cached" counts evictions since the last flush: after /flush_cache (a benchmark's
    fresh start) a prompt evicted before it is a plain miss, as one never seen."""
    engine = tiny_engine_factory(kv_cache_tokens=POOL, kv_host_cache_tokens=0)
    evicted, flushed = words(9, 240), words(10, 240)
    engine.generate(evicted, GREEDY)
    flood(engine)  # `evicted` leaves by the LRU
    engine.generate(flushed, GREEDY)
    assert engine.flush_cache()
    first = engine.stats()["recomputed_cached_tokens_total"]
    for prompt in (evicted, flushed):
        again = engine.generate(prompt, GREEDY)
        assert again.meta.cached_tokens < 5
    assert engine.stats()["recomputed_cached_tokens_total"] == first
    engine.generate(words(11, 240), GREEDY)  # the record starts again after the flush
    flood(engine)
    engine.generate(words(11, 240), GREEDY)
    assert engine.stats()["recomputed_cached_tokens_total"] >= first + 70
