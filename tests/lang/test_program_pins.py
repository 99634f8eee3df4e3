"""Program pins: while a program runs, each state's sequence (after a gen, or a select's scored prefix)
stays pinned in the engine's cache through pressure that evicts everything else; the run's end, its
failure or its cancellation releases every pin it held."""
from __future__ import annotations

import pytest

import radixlang as rl

POOL = 1024
ONE_SHOT = {"temperature": 0, "max_new_tokens": 2, "ignore_eos": True}


def words(seed: int, n: int) -> str:
    return " ".join(f"w{seed}x{i}" for i in range(n // 3))


def flood(engine) -> None:
    """Unique one-shot prompts (~280 tokens each), together twice the pool: unpinned KV goes."""
    engine.generate([words(100 + i, 120) for i in range(8)], ONE_SHOT)


def test_a_running_program_keeps_its_state_and_releases_it_at_the_end(tiny_engine_factory):
    # no host tier: with one, admission releases an idle pin at once (its KV parks on the host and comes
    # back; tests/runtime/test_pins.py), and this tests that the pin itself holds the state
    engine = tiny_engine_factory(kv_cache_tokens=POOL, kv_host_cache_tokens=0)
    seen = {}

    @rl.function
    def agent(s):
        s += words(1, 200)
        s += rl.gen("plan", max_tokens=4, temperature=0, ignore_eos=True)
        s.text()  # waits for the gen: the state's sequence is now pinned
        seen["pins"] = engine.stats()["kv_pins"]
        flood(engine)  # a "tool call" while the rest of the server is busy
        s += " result:" + rl.gen("act", max_tokens=4, temperature=0, ignore_eos=True)
        s += " answer:" + rl.select("pick", choices=["yes", "no"])
        s.text()
        seen["mid"] = engine.stats()

    state = agent.run(backend=rl.EngineBackend(engine))
    first = state.get_meta_info("plan")
    assert seen["pins"] == 1
    assert state.get_meta_info("act")["cached_tokens"] >= first["prompt_tokens"] + 3  # plan's prompt and KV'd output
    assert seen["mid"]["kv_pins"] == 1 and seen["mid"]["pins_released_under_pressure_total"] == 0
    engine.check_invariants()
    after = engine.stats()
    assert after["kv_pins"] == 0 and after["kv_pinned_tokens"] == 0  # released when the run ended


def test_forks_pin_each_branch_and_a_failed_program_pins_nothing(tiny_engine_factory):
    engine = tiny_engine_factory(kv_cache_tokens=POOL)
    seen = {}

    @rl.function
    def fails(s):
        s += words(2, 90)
        forks = s.fork(2)
        for i, f in enumerate(forks):
            f += f" branch {i}:" + rl.gen("b", max_tokens=3, temperature=0, ignore_eos=True)
        forks.join()
        seen["pins"] = engine.stats()["kv_pins"]
        raise RuntimeError("the tool crashed")

    state = fails.run(backend=rl.EngineBackend(engine))
    with pytest.raises(RuntimeError, match="tool crashed"):
        state.text()
    assert seen["pins"] == 2  # one per branch state (the root ran no gen)
    engine.check_invariants()
    assert engine.stats()["kv_pins"] == 0
