"""Decode speed under tensor parallelism: the same model at each --tp size (default 1 and 3: SmolLM2's 9
query heads split 3 ways) and each --quantization mode, every engine alive at once and the runs interleaved, so
machine load hits all alike. Prints tok/s per size and mode at batch 1 and batch 16, and the ratio to the first.

On a CPU the ranks share the host's cores (and gloo all-reduces through localhost), so TP there shows
the mechanism's overhead rather than a speedup; on GPUs each rank has its own device.
"""
from __future__ import annotations

import argparse
import time

from radixlang.benchmark.radix_cache import DECODE_PROMPTS as PROMPTS  # the same 16 prompts as the cache benchmark
from radixlang.runtime.engine import Engine

GREEDY = {"temperature": 0, "ignore_eos": True}


def timed_run(engine: Engine, prompts: list[str], new_tokens: int) -> tuple[int, float]:
    engine.flush_cache()
    t0 = time.perf_counter()
    outs = engine.generate(prompts, {**GREEDY, "max_new_tokens": new_tokens})
    return sum(o.meta.completion_tokens for o in outs), time.perf_counter() - t0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--tp", type=int, nargs="+", default=[1, 3])
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--quantization", nargs="+", default=["auto"],
                        help="the engines' modes (auto: the default); an engine per tp size and mode")
    args = parser.parse_args()
    engines = {(tp, mode): Engine(model=args.model, device="cpu", kv_cache_tokens=8192, tp_size=tp, quantization=mode)
               for mode in args.quantization for tp in args.tp}
    try:
        for batch in (1, 16):
            prompts = PROMPTS[:batch]
            for engine in engines.values():  # warm-up
                timed_run(engine, prompts, 4)
            best = {key: 0.0 for key in engines}
            for _ in range(args.repeats):
                for key, engine in engines.items():
                    tokens, seconds = timed_run(engine, prompts, args.new_tokens)
                    best[key] = max(best[key], tokens / seconds)
            first = next(iter(engines))
            for (tp, mode), rate in best.items():
                print(f"batch {batch:2d}  tp {tp} {mode:>4}: {rate:7.1f} tok/s  ({rate / best[first]:.2f}x tp {first[0]} "
                      f"{first[1]})")
        for engine in engines.values():
            engine.check_invariants()
    finally:
        for engine in engines.values():
            engine.shutdown()


if __name__ == "__main__":
    main()
