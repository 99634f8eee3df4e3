"""GET /metrics in the Prometheus text format (0.0.4), from the engine's counters."""
from __future__ import annotations

PROMETHEUS_CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"

# (metric, engine stats key or None for a rate, type, help)
_METRICS = (
    ("num_running_requests", "running_requests", "gauge", "Requests admitted and being computed."),
    ("num_waiting_requests", "waiting_requests", "gauge", "Requests queued or preempted, waiting to run."),
    ("kv_cache_usage", "kv_usage", "gauge", "Share of the KV pool in use (live requests and cached prefixes)."),
    ("kv_pool_tokens", "kv_pool_tokens", "gauge", "Size of the KV pool in tokens."),
    ("kv_free_tokens", "kv_free_tokens", "gauge", "KV slots free right now."),
    ("kv_cached_tokens", "kv_cached_tokens", "gauge", "Tokens held in the radix cache."),
    ("kv_pinned_tokens", "kv_pinned_tokens", "gauge", "Cached tokens held by pins (sessions, running programs)."),
    ("kv_pins", "kv_pins", "gauge", "Pins held (prompt_cache_key sessions and program states)."),
    ("pins_released_under_pressure_total", "pins_released_under_pressure_total", "counter",
     "Pins given up early for KV memory or the pinned budget."),
    ("pins_expired_total", "pins_expired_total", "counter", "Pins released when their retention ran out."),
    ("recomputed_cached_tokens_total", "recomputed_cached_tokens_total", "counter",
     "Prompt tokens prefilled again that had been cached before and evicted (since the last flush)."),
    ("host_cache_tokens", "host_cache_tokens", "gauge", "Tokens of KV parked in the host tier."),
    ("host_restored_tokens_total", "host_restored_tokens_total", "counter",
     "Prompt tokens whose KV was copied back from the host tier instead of recomputed."),
    ("cache_hit_rate", "cache_hit_rate", "gauge", "Share of prompt tokens served from the radix cache."),
    ("prompt_tokens_total", "prompt_tokens_total", "counter", "Prompt tokens admitted."),
    ("cached_tokens_total", "cached_tokens_total", "counter", "Prompt tokens reused from the radix cache."),
    ("generation_tokens_total", "generated_tokens_total", "counter", "Tokens generated."),
    ("requests_finished_total", "finished_requests_total", "counter", "Requests that finished."),
    ("requests_aborted_total", "aborted_requests_total", "counter", "Requests aborted."),
    ("preemptions_total", "preemptions_total", "counter",
     "Requests preempted to free KV memory or for a higher class."),
    ("priority_preemptions_total", "priority_preemptions_total", "counter",
     "Requests preempted for a higher class (priority, or a session's turn over one-shot requests)."),
    ("scheduler_steps_total", "steps_total", "counter", "Scheduler steps that ran the model."),
)


# SGLang's names for the gauges a router's load monitor (smg) and SGLang dashboards read, (stats key or None
# for the generation rate): sglang:token_usage is the one smg requires before it trusts the others
_SGLANG_GAUGES = (
    ("num_running_reqs", "running_requests", "Requests running (SGLang's name)."),
    ("num_queue_reqs", "waiting_requests", "Requests waiting (SGLang's name)."),
    ("token_usage", "kv_usage", "Share of the KV pool in use (SGLang's name)."),
    ("utilization", "kv_usage", "Share of the KV pool in use (SGLang's name for load)."),
    ("cache_hit_rate", "cache_hit_rate", "Share of prompt tokens served from the radix cache (SGLang's name)."),
    ("gen_throughput", None, "Tokens generated per second, recent average (SGLang's name)."),
)


def render_metrics(stats: dict[str, float], prompt_tps: float, generation_tps: float, model: str) -> str:
    label = '{model_name="' + model.replace("\\", "\\\\").replace('"', '\\"') + '"}'
    rows = [(name, stats[key], kind, text) for name, key, kind, text in _METRICS]
    rows += [
        ("prompt_tokens_per_second", prompt_tps, "gauge", "Prompt tokens admitted per second, recent average."),
        ("generation_tokens_per_second", generation_tps, "gauge", "Tokens generated per second, recent average."),
    ]
    lines = []
    for name, value, kind, text in rows:
        full = f"radixlang_{name}"
        lines += [f"# HELP {full} {text}", f"# TYPE {full} {kind}", f"{full}{label} {float(value)!r}"]
    for name, key, text in _SGLANG_GAUGES:
        value = generation_tps if key is None else stats[key]
        lines += [f"# HELP sglang:{name} {text}", f"# TYPE sglang:{name} gauge", f"sglang:{name}{label} {float(value)!r}"]
    return "\n".join(lines) + "\n"
