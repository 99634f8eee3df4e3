"""CPU engine speed of this tree against a baseline checkout of radixlang, measured in the same run.

    git worktree add /tmp/radixlang-base main        # or any commit
    python benchmark/step_regression.py --baseline /tmp/radixlang-base

Workloads on SmolLM2-135M (greedy, fp32, CPU): few-shot (32 questions after a shared 8-shot prefix,
8 tokens each), batch-1 decode (1 prompt x 64 tokens) and batched decode (16 prompts x 64 tokens).
Each side runs in its own process, the two alternating, best of --rounds; prints tokens/s and the
ratio this tree / baseline (above 1.0: this tree is faster). Only the public Engine API is used, so
any two versions compare.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
WORKLOADS = ("few-shot", "batch-1 decode", "16x64 decode")


def workload(name: str) -> tuple[list[str], int]:
    sys.path.insert(0, str(HERE))
    from radix_cache import DECODE_PROMPTS, few_shot_prompts

    if name == "few-shot":
        return few_shot_prompts(), 8
    if name == "batch-1 decode":
        return DECODE_PROMPTS[:1], 64
    return DECODE_PROMPTS, 64


def worker(name: str, repeats: int) -> None:
    from radixlang.runtime.engine import Engine

    prompts, max_new = workload(name)
    params = {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True}
    with Engine(device="cpu", kv_cache_tokens=16384) as engine:
        engine.generate(prompts[:2], {**params, "max_new_tokens": 4})  # warm-up
        best = None
        for _ in range(repeats):
            engine.flush_cache()
            t0 = time.perf_counter()
            outs = engine.generate(prompts, params)
            elapsed = time.perf_counter() - t0
            best = elapsed if best is None else min(best, elapsed)
        engine.check_invariants()
    generated = sum(o.meta.completion_tokens for o in outs)
    print(json.dumps({"seconds": best, "generated": generated, "texts": [o.text for o in outs]}))


def run_in_tree(tree: Path, argv: list[str]) -> str:
    """Runs `python argv...` with `radixlang` imported from `tree`; returns its stdout."""
    with tempfile.TemporaryDirectory() as path_dir:
        (Path(path_dir) / "radixlang").symlink_to(tree.resolve())
        env = {**os.environ, "PYTHONPATH": path_dir}
        return subprocess.run([sys.executable, *argv], env=env, check=True, capture_output=True, text=True).stdout


def run_side(tree: Path, name: str, repeats: int) -> dict:
    """Runs the worker with `radixlang` imported from `tree`."""
    out = run_in_tree(tree, [__file__, "--worker", name, "--repeats", str(repeats)])
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--baseline", type=Path, help="a checkout of the radixlang version to compare with")
    parser.add_argument("--rounds", type=int, default=2, help="alternating runs per side; the best counts")
    parser.add_argument("--repeats", type=int, default=2, help="timed runs inside each process")
    parser.add_argument("--only", choices=WORKLOADS, action="append", help="run just these workloads")
    parser.add_argument("--worker", choices=WORKLOADS, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker, args.repeats)
        return
    if args.baseline is None:
        parser.error("--baseline is required")
    sides = {"baseline": args.baseline, "this tree": HERE.parent}
    for name in args.only or WORKLOADS:
        best: dict[str, dict] = {}
        for _ in range(args.rounds):
            for side, tree in sides.items():
                r = run_side(tree, name, args.repeats)
                if side not in best or r["seconds"] < best[side]["seconds"]:
                    best[side] = r
        rate = {side: r["generated"] / r["seconds"] for side, r in best.items()}
        same = best["baseline"]["texts"] == best["this tree"]["texts"]
        print(f"{name:15} baseline {rate['baseline']:7.1f} tok/s   this tree {rate['this tree']:7.1f} tok/s   "
              f"ratio {rate['this tree'] / rate['baseline']:.2f}x   greedy outputs identical: {same}")


if __name__ == "__main__":
    main()
