"""What a workload is, what one system's run of it returns, and how that run is timed."""
from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from radixlang.runtime.engine import Engine

    from .plain_lm import PlainLM
    from .systems import Systems


@dataclass(slots=True)
class Run:
    """One system's pass over a workload's items: an answer per item, and per-call latencies in seconds
    (a plain LM's are read from its counters)."""

    answers: list[Any]
    latencies: list[float] = field(default_factory=list)


@dataclass(slots=True)
class Variant:
    """A system running a workload. `engine` (radixlang) or `lm` (a baseline) is read for tokens,
    cache hits and latencies around the run."""

    label: str
    run: Callable[[], Run]
    engine: "Engine | None" = None
    lm: "PlainLM | None" = None


@dataclass(slots=True)
class Workload:
    """`make_items(n)` generates n items; `run_radixlang(backend, items)` runs the radixlang program;
    `run_plain(lm, items)` is the same workload in hand-written Python over a plain LM (None: no such
    baseline); `accuracy(items, answers)` scores answers against the items' key (None: no key);
    `variants(systems, items, default)` replaces the default variants (every engine, then every LM);
    `latency`: whether per-call latency means something here (calls wait on each other, not on a batch)."""

    name: str
    description: str
    make_items: Callable[[int], list[Any]]
    run_radixlang: Callable[[Any, list[Any]], Run]
    run_plain: Callable[["PlainLM", list[Any]], Run] | None = None
    accuracy: Callable[[list[Any], list[Any]], float] | None = None
    variants: Callable[["Systems", list[Any], list[Variant]], list[Variant]] | None = None
    latency: bool = False


@dataclass(slots=True)
class Measurement:
    system: str
    programs: int
    seconds: float
    programs_per_s: float
    tokens_per_s: float
    latency_p50: float | None
    latency_p99: float | None
    cache_hit_rate: float | None
    accuracy: float | None


def percentile(values: list[float], q: float) -> float | None:
    """Nearest-rank percentile; None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(q / 100 * len(ordered) + 0.5) - 1))]


def measure(variant: Variant, workload: Workload, items: list[Any]) -> Measurement:
    """Times one variant from an empty prefix cache; reads the engine's stats (or the LM's counters)
    before and after, so tokens and cache hits are this run's alone."""
    engine, lm = variant.engine, variant.lm
    if engine is not None:
        engine.flush_cache()
        before = engine.stats()
    tokens_before = lm.generated_tokens if lm else 0
    latencies_before = len(lm.latencies) if lm else 0
    started = time.perf_counter()
    run = variant.run()
    seconds = time.perf_counter() - started
    hit_rate = None
    if engine is not None:
        after = engine.stats()
        engine.check_invariants()
        tokens = after["generated_tokens_total"] - before["generated_tokens_total"]
        prompt = after["prompt_tokens_total"] - before["prompt_tokens_total"]
        hit_rate = (after["cached_tokens_total"] - before["cached_tokens_total"]) / prompt if prompt else 0.0
    else:
        assert lm is not None, "a variant reads either an engine or a plain LM"
        tokens = lm.generated_tokens - tokens_before
        run.latencies += lm.latencies[latencies_before:]
    latencies = run.latencies if workload.latency else []
    return Measurement(
        system=variant.label, programs=len(items), seconds=seconds, programs_per_s=len(items) / seconds,
        tokens_per_s=tokens / seconds, latency_p50=percentile(latencies, 50),
        latency_p99=percentile(latencies, 99), cache_hit_rate=hit_rate,
        accuracy=workload.accuracy(items, run.answers) if workload.accuracy else None)
