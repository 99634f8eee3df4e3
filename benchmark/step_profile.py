"""Where one engine step's time goes: the model's forward and logits against the host work around them
(scheduling, the attention plan, sampling, appending / detokenizing / streaming), in ms per step.

    python benchmark/step_profile.py --rows 1 --quantization auto
    python benchmark/step_profile.py --rows 16 --cprofile 25    # also the 25 costliest functions

Greedy decode of --rows prompts x --tokens tokens on SmolLM2-135M (or --model); the best of --repeats
runs counts. Each part is timed by wrapping the method that does it, so the parts nest: `runner` holds
`plan`, `model` and `logits`; `process` holds `sample`. A shared machine makes absolute figures noise:
compare two trees in one session, interleaved.
"""
from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from radixlang.runtime.engine import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from radix_cache import DECODE_PROMPTS  # noqa: E402  (the cache benchmark's prompts)


def timed_parts(engine: Engine) -> tuple[Counter, Callable[[bool], None]]:
    """Wraps the step's parts with timers; returns the seconds per part and a switch to turn counting on."""
    spent: Counter = Counter()
    counting = [False]
    s = engine.scheduler
    parts = {"step": (s, "step"), "schedule": (s, "_schedule"), "runner": (s.runner, "forward"),
             "plan": (s.runner.attn, "plan"), "model": (s.runner.model, "forward"),
             "logits": (s.runner.model, "compute_logits"), "process": (s.output, "process"),
             "sample": (s.output, "_sample")}
    for name, (owner, attr) in parts.items():
        setattr(owner, attr, _timer(getattr(owner, attr), name, spent, counting))
    return spent, lambda on: counting.__setitem__(0, on)


def _timer(fn: Callable, name: str, spent: Counter, counting: list[bool]) -> Callable:
    def run(*args, **kwargs):
        t0 = time.perf_counter()
        out = fn(*args, **kwargs)
        if counting[0]:
            spent[name] += time.perf_counter() - t0
        return out
    return run


def profile_steps(engine: Engine, profiler: cProfile.Profile) -> None:
    """The scheduler thread runs the steps, so the profiler is switched on there, around each one."""
    step = engine.scheduler.step

    def profiled():
        profiler.enable()
        try:
            return step()
        finally:
            profiler.disable()
    engine.scheduler.step = profiled


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a GGUF file or HF folder (default: SmolLM2-135M)")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--rows", type=int, default=1, help="prompts decoded together (at most 16)")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cprofile", type=int, default=0, help="also print this many functions by own time")
    args = parser.parse_args()
    params = {"temperature": 0, "ignore_eos": True, "max_new_tokens": args.tokens}
    prompts = DECODE_PROMPTS[:args.rows]
    with Engine(args.model, device="cpu", kv_cache_tokens=16384, quantization=args.quantization) as engine:
        spent, count = timed_parts(engine)
        engine.generate(prompts[:2], {**params, "max_new_tokens": 4})  # warm-up
        profiler = cProfile.Profile() if args.cprofile else None
        if profiler is not None:
            profile_steps(engine, profiler)
        best: tuple[float, dict] | None = None
        for _ in range(args.repeats):
            engine.flush_cache()
            spent.clear()
            count(True)
            t0 = time.perf_counter()
            engine.generate(prompts, params)
            engine.stats()  # returns once the scheduler thread is past the last step
            elapsed = time.perf_counter() - t0
            count(False)
            if best is None or elapsed < best[0]:
                best = (elapsed, dict(spent))
        engine.check_invariants()
    elapsed, parts = best
    per_step = {name: seconds * 1000 / args.tokens for name, seconds in parts.items()}
    forward = per_step.get("model", 0.0) + per_step.get("logits", 0.0)
    print(f"{args.rows} row(s) x {args.tokens} tokens, quantization={args.quantization}: "
          f"{elapsed * 1000 / args.tokens:.3f} ms per step (wall)")
    for name in ("step", "model", "logits", "runner", "plan", "schedule", "process", "sample"):
        print(f"  {name:9} {per_step.get(name, 0.0):8.3f} ms")
    host = per_step.get("step", 0.0) - forward
    print(f"  host work in the step (step - model - logits): {host:.3f} ms ({host / per_step['step']:.1%})")
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.cprofile)


if __name__ == "__main__":
    main()
