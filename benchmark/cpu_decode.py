"""CPU decode speed of SmolLM2-135M with fp32 weights (the default, exact) against weight-only int8
(`quantization="int8"`), measured in the same run, and what int8 costs in fidelity.

Prints tok/s at batch 1 (64 tokens) and 16 x 64, the ratio int8 / fp32, and how many of the 20
reference prompts (tests/data/hf_greedy_smollm2.json, HF transformers' greedy ids) each mode
reproduces exactly, how many leading tokens int8 shares with fp32, and the mean |delta| of the chosen
tokens' logprobs over that shared part.
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from radixlang.runtime.engine import Engine

sys.path.insert(0, str(Path(__file__).resolve().parent))
from radix_cache import DECODE_PROMPTS as PROMPTS  # noqa: E402  (the same 16 prompts as the cache benchmark)

ROOT = Path(__file__).resolve().parents[1]
CASES = json.loads((ROOT / "tests" / "data" / "hf_greedy_smollm2.json").read_text())["cases"]
GREEDY = {"temperature": 0, "ignore_eos": True}


def tok_per_s(engine: Engine, prompts: list[str], new_tokens: int, repeats: int) -> float:
    best = None
    for _ in range(repeats):
        engine.flush_cache()
        t0 = time.perf_counter()
        outs = engine.generate(prompts, {**GREEDY, "max_new_tokens": new_tokens})
        elapsed = time.perf_counter() - t0
        best = elapsed if best is None else min(best, elapsed)
    return sum(o.meta.completion_tokens for o in outs) / best


def reference_run(engine: Engine) -> tuple[int, list[list[int]], list[list[float]]]:
    """(prompts whose greedy ids equal transformers', ids per prompt, chosen-token logprobs per prompt)."""
    same, ids, logprobs = 0, [], []
    for case in CASES:
        out = engine.generate(input_ids=case["input_ids"], return_logprob=True,
                              sampling_params={"temperature": 0, "max_new_tokens": len(case["output_ids"])})
        same += out.output_ids == case["output_ids"]
        ids.append(out.output_ids)
        logprobs.append([lp.logprob for lp in out.meta.output_logprobs])
    return same, ids, logprobs


def shared_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="timed runs per workload; the best counts")
    args = parser.parse_args()
    results = {}
    for mode in ("none", "int8"):
        with Engine(device="cpu", kv_cache_tokens=16384, quantization=mode) as engine:
            engine.generate(PROMPTS[:2], {**GREEDY, "max_new_tokens": 4})  # warm-up
            results[mode] = {
                "batch 1": tok_per_s(engine, PROMPTS[:1], 64, args.repeats),
                "16 x 64": tok_per_s(engine, PROMPTS, 64, args.repeats),
                "reference": reference_run(engine),
            }
            engine.check_invariants()
    for workload in ("batch 1", "16 x 64"):
        fp32, int8 = results["none"][workload], results["int8"][workload]
        print(f"{workload:8} fp32 {fp32:7.1f} tok/s   int8 {int8:7.1f} tok/s   ratio {int8 / fp32:.2f}x")
    (same32, ids32, lp32), (same8, ids8, lp8) = results["none"]["reference"], results["int8"]["reference"]
    shared = [shared_prefix(a, b) for a, b in zip(ids32, ids8)]
    deltas = [abs(x - y) for n, r32, r8 in zip(shared, lp32, lp8) for x, y in zip(r32[:n], r8[:n])]
    print(f"greedy ids equal to transformers on {len(CASES)} reference prompts: fp32 {same32}, int8 {same8}")
    print(f"int8 shares its first {sum(shared) / len(shared):.1f} of {len(ids32[0])} tokens with fp32 on average; "
          f"mean |logprob delta| of those tokens {sum(deltas) / len(deltas):.4f}")


if __name__ == "__main__":
    main()
