"""What `radixlang serve` says in its log: a start-up banner, a step line every few seconds while busy, and a
shutdown line. Lines go to the `radixlang.server` logger at info level; `configure_logging` gives the
`radixlang` loggers a handler when nothing else did (uvicorn configures only its own loggers)."""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from ..cache_dir import human_bytes
from .config import STEP_LOG_INTERVAL_S

if TYPE_CHECKING:
    from ..runtime.engine import Engine

logger = logging.getLogger("radixlang.server")


def configure_logging(level: str) -> None:
    """Info lines of every radixlang logger (the server's, the background compile's, the weight cache's) on stderr,
    as uvicorn prints its own; left alone when the application configured logging itself."""
    package = logging.getLogger("radixlang")
    package.setLevel(level.upper())
    if package.handlers or logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(message)s", "%Y-%m-%d %H:%M:%S"))
    package.addHandler(handler)


def version() -> str:
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("radixlang")
    except PackageNotFoundError:  # a checkout on sys.path, not installed
        return "unknown"


def model_format(path: str) -> str:
    """GGUF (its file type as llama.cpp names it is in the weights' own header), an HF folder (and its
    quantization method, when config.json declares one), or 'unknown'."""
    p = Path(path)
    if p.suffix == ".gguf" and p.is_file():
        return "GGUF"
    config = p / "config.json"
    if config.is_file():
        import json

        method = (json.loads(config.read_text()).get("quantization_config") or {}).get("quant_method")
        return f"HF folder ({method})" if method else "HF folder"
    return "unknown"


def _kv_bytes(engine: Engine) -> int | None:
    """Bytes of the KV pool (every layer's K and V) where this process holds it; None where it does not
    (tensor-parallel ranks and data-parallel attention ranks each hold their own share)."""
    from ..runtime.scheduling.scheduler import Scheduler

    scheduler = engine.scheduler
    if not isinstance(scheduler, Scheduler) or not scheduler.kv.pool.k_buffers:
        return None
    return engine.pool_size * scheduler.kv.pool.token_bytes


def _cpu_paths(engine: Engine) -> str:
    """The CPU's kernel level and features, and the dtype of the dense copies large steps use."""
    if engine.device.type != "cpu":
        return "-"
    from ..runtime.models.linear.cpu_paths import detect

    paths = detect()
    dense = "bf16" if "bfloat16" in str(paths.dense_dtype) else "fp32"
    return f"{paths.capability} [{' '.join(paths.flags) or 'none'}] packed int4/int8 + {dense} dense"


def _compile_state(engine: Engine) -> str:
    compile_ = engine.decode_compile
    return "off (eager decode)" if compile_ is None else f"background ({compile_.state})"


def _quantization(engine: Engine) -> str:
    mode = engine.config.load_quantization()
    if mode != "auto":
        return mode
    gguf = model_format(engine.model_path) == "GGUF"
    return "auto (the GGUF's own blocks, packed)" if gguf else "auto (weights as stored)"


def banner(engine: Engine, url: str, api_keys: bool) -> str:
    """One line that says what this server is: `key=value` pairs, in a fixed order."""
    kv_bytes = _kv_bytes(engine)
    fields = {
        "version": version(),
        "model": engine.model_path,
        "format": model_format(engine.model_path),
        "quantization": _quantization(engine),
        "device": str(engine.device),
        "cpu_paths": _cpu_paths(engine),
        "dtype": str(engine.config.torch_dtype()).removeprefix("torch."),
        "kv_pool": f"{engine.pool_size} tokens" + (f" ({human_bytes(kv_bytes)})" if kv_bytes is not None else ""),
        "context_length": engine.context_length,
        "compile": _compile_state(engine),
        "url": url,
        "api_keys": "on" if api_keys else "off",
    }
    return "radixlang serving: " + ", ".join(f"{k}={v}" for k, v in fields.items())


@dataclass
class StepLog:
    """Turns counter samples (engine.stats(), taken every second by the server) into a line every
    `interval_s` while the engine is busy: requests running and queued, the KV pool's use, the prefix cache's
    hit rate over the interval, prefill and decode tokens per second. Silent while idle. (The background
    compile logs its own start and end: runtime/models/compiled.py.)"""

    interval_s: float = STEP_LOG_INTERVAL_S
    last: tuple[float, dict[str, float]] | None = None  # (time, stats) of the last line, or the first sample
    latest: dict[str, float] = field(default_factory=dict)

    def observe(self, t: float, stats: dict[str, float]) -> None:
        self.latest = stats
        if self.last is None:
            self.last = (t, stats)
            return
        t0, before = self.last
        if t - t0 < self.interval_s:
            return
        self.last = (t, stats)
        line = step_line(before, stats, t - t0)
        if line is not None:
            logger.info(line)


def shutdown_line(stats: dict[str, float], uptime_s: float) -> str:
    return (f"radixlang server stopped after {uptime_s:.0f} s: {int(stats.get('finished_requests_total', 0))} "
            f"requests finished, {int(stats.get('aborted_requests_total', 0))} aborted, "
            f"{int(stats.get('generated_tokens_total', 0))} tokens generated")


def step_line(before: dict[str, float], after: dict[str, float], seconds: float) -> str | None:
    """The line for one interval, or None when the engine was idle through it (nothing ran or waited at its
    end, and no token was admitted or generated during it)."""
    prompt = after["prompt_tokens_total"] - before["prompt_tokens_total"]
    cached = after["cached_tokens_total"] - before["cached_tokens_total"]
    generated = after["generated_tokens_total"] - before["generated_tokens_total"]
    running, waiting = int(after["running_requests"]), int(after["waiting_requests"])
    if not (running or waiting or prompt or generated):
        return None
    hit = f"{100 * cached / prompt:.1f}%" if prompt else "-"
    return (f"step: running {running}, queued {waiting}, KV {100 * after['kv_usage']:.1f}% of "
            f"{int(after['kv_pool_tokens'])} tokens, cache hit {hit}, prefill {(prompt - cached) / seconds:.1f} "
            f"tok/s, decode {generated / seconds:.1f} tok/s")
