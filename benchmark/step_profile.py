"""Where one engine step's time goes: the model's forward, logits and sampler math against the host work
around them (scheduling, the attention plan, building rows, appending / detokenizing / streaming), in ms
per step.

    python benchmark/step_profile.py --rows 1 --quantization auto
    python benchmark/step_profile.py --rows 16 --cprofile 25    # also the 25 costliest functions
    python benchmark/step_profile.py --quantization auto --compile true --clock cpu   # the compiled decode
    python benchmark/step_profile.py --random tiny --rows 256 --tokens 32 --cuda-graph
    python benchmark/step_profile.py --random tiny --rows 256 --baseline /tmp/radixlang-base

Greedy decode of --rows prompts x --tokens tokens on SmolLM2-135M (or --model, or --random: a random-weight
model of a named shape with SmolLM2's tokenizer, written to a temp folder, so the host work of a large
batch can be measured without the real model's forward drowning it); the best of --repeats runs counts.
Each part is timed by wrapping the method that does it, so the parts nest: `runner` holds `plan`,
`model` and `logits`; `process` holds `sample`, which holds `sampler` (the sampler's device math and its
one host copy). Host work = step - model - logits - plan_decode - sampler: everything a GPU would not do. `release`, the
freeing of the step's logits (the OS's work on a CPU, the caching allocator's on a GPU), is timed after the
step, outside it.
--cuda-graph runs decode steps through runtime/execution/cuda_graph.py's padded path (captured on CUDA, eager on
the CPU), whose attention plan (`plan_decode`) is device work.

--baseline TREE profiles another checkout of radixlang on the same model and prompts, the two trees in
alternating processes (best of --rounds each), and prints each part side by side with the ratio baseline /
this tree. A shared machine makes absolute figures noise; the ratios measured in one run are the result.
"""
from __future__ import annotations

import argparse
import cProfile
import json
import pstats
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Callable

from radixlang.benchmark.radix_cache import DECODE_PROMPTS  # the cache benchmark's prompts
from radixlang.runtime.engine import Engine
from radixlang.runtime.execution import output_processor

PARTS = ("step", "model", "logits", "sampler", "runner", "plan", "plan_decode", "schedule", "process", "sample",
         "release")
CLOCKS = {"wall": time.perf_counter, "cpu": time.thread_time}
DEVICE_PARTS = ("model", "logits", "plan_decode", "sampler")  # what a GPU does; the rest is host work


def timed_parts(engine: Engine, clock: Callable[[], float] = time.perf_counter
                ) -> tuple[Counter, Callable[[bool], None]]:
    """Wraps the step's parts with timers; returns the seconds per part and a switch to turn counting on.
    `sampler` wraps the output processor module's `sample_step`, so it times every engine in the process.
    `clock`: time.perf_counter (wall), or time.thread_time (the scheduler thread's CPU time, which other
    processes on a shared machine disturb far less; torch's other threads are not counted)."""
    spent: Counter = Counter()
    counting = [False]
    s = engine.core
    parts = {"step": (s, "step"), "schedule": (s.scheduler, "_schedule"), "runner": (s.runner, "forward"),
             "plan": (s.runner.attn, "plan"), "plan_decode": (s.runner.attn, "plan_decode"),
             "model": (s.runner.model, "forward"), "logits": (s.runner.model, "compute_logits"),
             "process": (s.outputs, "process"), "sample": (s.outputs, "_sample"),
             "sampler": (output_processor, "sample_step")}
    for name, (owner, attr) in parts.items():
        setattr(owner, attr, _timer(getattr(owner, attr), name, spent, counting, clock))
    _time_release(s, spent, counting, clock)
    return spent, lambda on: counting.__setitem__(0, on)


def _time_release(s, spent: Counter, counting: list[bool], clock: Callable[[], float]) -> None:
    """Frees each step's logits after the step, as `release`: on the CPU, handing a [rows, vocab] tensor
    back to the OS costs ms at a large batch, which a GPU's caching allocator does not pay."""
    held: list = []
    forward, step = s.runner.forward, s.step

    def keep(*args, **kwargs):
        held.append(out := forward(*args, **kwargs))
        return out

    def step_then_release(*args, **kwargs):
        out = step(*args, **kwargs)
        t0 = clock()
        held.clear()
        if counting[0]:
            spent["release"] += clock() - t0
        return out
    s.runner.forward, s.step = keep, step_then_release


def _timer(fn: Callable, name: str, spent: Counter, counting: list[bool], clock: Callable[[], float]) -> Callable:
    def run(*args, **kwargs):
        t0 = clock()
        out = fn(*args, **kwargs)
        if counting[0]:
            spent[name] += clock() - t0
        return out
    return run


def profile_steps(engine: Engine, profiler: cProfile.Profile) -> None:
    """The scheduler thread runs the steps, so the profiler is switched on there, around each one."""
    step = engine.core.step

    def profiled():
        profiler.enable()
        try:
            return step()
        finally:
            profiler.disable()
    engine.core.step = profiled


def prompts_for(rows: int) -> list[str]:
    """The cache benchmark's 16 decode prompts; beyond 16, numbered variants of them (distinct after the
    second token, so no long shared prefix turns decode steps into cascade steps)."""
    if rows <= len(DECODE_PROMPTS):
        return DECODE_PROMPTS[:rows]
    return [f"Request {i}: {DECODE_PROMPTS[i % len(DECODE_PROMPTS)]}" for i in range(rows)]


def random_model(shape: str, folder: Path) -> Path:
    """A random-weight model of the named shape with SmolLM2's tokenizer, written under `folder`."""
    from radixlang.testing.random_llama import (
        SMOLLM2_135M,
        TINY_CONFIG,
        smollm2_tokenizer,
        tiny_weights,
        write_hf_folder,
    )

    cfg = {"tiny": TINY_CONFIG, "smollm2-135m": SMOLLM2_135M}[shape]
    return write_hf_folder(folder / shape, cfg, tiny_weights(cfg), smollm2_tokenizer())


def profile(args: argparse.Namespace, profiler: cProfile.Profile | None = None) -> dict:
    """Runs the workload; returns the best run's wall ms per step, ms per step of each part, and texts."""
    params = {"temperature": 0, "ignore_eos": True, "max_new_tokens": args.tokens}
    prompts = prompts_for(args.rows)
    options = {"device": "cpu", "quantization": args.quantization,
               "kv_cache_tokens": max(16384, 2 * args.rows * (args.tokens + 32)),
               "max_running_requests": max(64, args.rows), "disable_cuda_graph": not args.cuda_graph,
               "compile_layers": args.compile}
    with Engine(args.model, **options) as engine:
        wait_for_compile(engine)
        spent, count = timed_parts(engine, CLOCKS[args.clock])
        engine.generate(prompts, {**params, "max_new_tokens": 4})  # warm-up at the measured batch size
        if profiler is not None:
            profile_steps(engine, profiler)
        best: tuple[float, dict, list[str]] | None = None
        for _ in range(args.repeats):
            engine.flush_cache()
            spent.clear()
            count(True)
            t0 = time.perf_counter()
            outs = engine.generate(prompts, params)
            engine.stats()  # returns once the scheduler thread is past the last step
            elapsed = time.perf_counter() - t0
            count(False)
            if best is None or elapsed < best[0]:
                best = (elapsed, dict(spent), [o.text for o in outs])
        engine.check_invariants()
    elapsed, parts, texts = best
    per_step = {name: parts.get(name, 0.0) * 1000 / args.tokens for name in PARTS}
    per_step["host"] = per_step["step"] - sum(per_step[name] for name in DEVICE_PARTS)
    return {"wall": elapsed * 1000 / args.tokens, "parts": per_step, "texts": texts}


def wait_for_compile(engine: Engine) -> None:
    """Steps time the compiled decode forward where the engine compiles one (compile_layers), not the eager
    forward it serves with while the background compile runs."""
    compiling = engine.decode_compile
    if compiling is None:
        print("decode: eager", file=sys.stderr)
        return
    t0 = time.perf_counter()
    compiling.finished.wait()
    state = "compiled" if compiling.ready else f"compile failed ({compiling.error}), eager"
    print(f"decode: {state}, waited {time.perf_counter() - t0:.0f} s for the background compile", file=sys.stderr)


def print_profile(args: argparse.Namespace, result: dict) -> None:
    parts = result["parts"]
    print(f"{args.rows} row(s) x {args.tokens} tokens, quantization={args.quantization}, "
          f"cuda_graph={args.cuda_graph}, clock={args.clock}: {result['wall']:.3f} ms per step (wall)")
    for name in PARTS:
        print(f"  {name:11} {parts[name]:8.3f} ms")
    print(f"  host work in the step (step - {' - '.join(DEVICE_PARTS)}): {parts['host']:.3f} ms "
          f"({parts['host'] / parts['step']:.1%})")


def compare(args: argparse.Namespace, model: str | None) -> None:
    """Both trees in alternating worker processes; prints each part's best ms per step and the ratio."""
    from step_regression import run_in_tree

    forwarded = [a for a in sys.argv[1:] if a not in ("--baseline", str(args.baseline))]
    forwarded = _without_option(_without_option(_without_option(forwarded, "--random"), "--model"), "--rounds")
    forwarded += ["--json"] + (["--model", model] if model else [])
    sides = {"baseline": args.baseline, "this tree": Path(__file__).resolve().parents[1]}
    best: dict[str, dict] = {}
    for _ in range(args.rounds):
        for side, tree in sides.items():
            r = json.loads(run_in_tree(tree, [__file__, *forwarded]).strip().splitlines()[-1])
            if side not in best:
                best[side] = r
            else:  # each part's best over the rounds: load spikes hit single runs
                best[side]["parts"] = {k: min(v, r["parts"][k]) for k, v in best[side]["parts"].items()}
                best[side]["wall"] = min(best[side]["wall"], r["wall"])
    base, this = best["baseline"], best["this tree"]
    print(f"{args.rows} row(s) x {args.tokens} tokens, cuda_graph={args.cuda_graph}, clock={args.clock}: "
          f"ms per step, each part's best of "
          f"{args.rounds} rounds x {args.repeats} runs")
    print(f"  {'part':11} {'baseline':>9} {'this tree':>9}   baseline / this tree")
    for name in ("wall", *PARTS, "host"):
        b = base["wall"] if name == "wall" else base["parts"][name]
        t = this["wall"] if name == "wall" else this["parts"][name]
        ratio = f"{b / t:6.2f}x" if t > 0 else "     -"
        print(f"  {name:11} {b:9.3f} {t:9.3f}   {ratio}")
    print(f"  greedy outputs identical: {base['texts'] == this['texts']}")


def _without_option(argv: list[str], option: str) -> list[str]:
    """argv less `option` and its value (given as `option value` or `option=value`)."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == option:
            skip = True
        elif not a.startswith(option + "="):
            out.append(a)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="a GGUF file or HF folder (default: SmolLM2-135M)")
    parser.add_argument("--random", choices=("tiny", "smollm2-135m"),
                        help="a random-weight model of this shape with SmolLM2's tokenizer, instead of --model")
    parser.add_argument("--quantization", default="none")
    parser.add_argument("--rows", type=int, default=1, help="prompts decoded together")
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--cuda-graph", action="store_true", help="decode through the padded CUDA-graph path")
    parser.add_argument("--compile", default="auto", choices=("auto", "true", "false"),
                        help="compile_layers: the CPU decode forward compiled (true), eager (false), or the default")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                        help="what times the parts: wall time, or the scheduler thread's CPU time (steadier "
                             "on a shared machine; on a GPU, wall)")
    parser.add_argument("--cprofile", type=int, default=0, help="also print this many functions by own time")
    parser.add_argument("--baseline", type=Path, help="a checkout of radixlang to profile alongside this tree")
    parser.add_argument("--rounds", type=int, default=2, help="with --baseline: alternating runs per side")
    parser.add_argument("--json", action="store_true", help=argparse.SUPPRESS)  # a --baseline worker's output
    args = parser.parse_args()
    if args.rows < 1 or args.tokens < 1 or args.repeats < 1 or args.rounds < 1:
        parser.error("--rows, --tokens, --repeats and --rounds must be >= 1")
    with tempfile.TemporaryDirectory() as folder:
        model = str(random_model(args.random, Path(folder))) if args.random else args.model
        if args.baseline is not None:
            compare(args, model)
            return
        args.model = model
        profiler = cProfile.Profile() if args.cprofile else None
        result = profile(args, profiler)
    if args.json:
        print(json.dumps(result))
        return
    print_profile(args, result)
    if profiler is not None:
        pstats.Stats(profiler).sort_stats("tottime").print_stats(args.cprofile)


if __name__ == "__main__":
    main()
