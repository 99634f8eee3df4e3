"""Engine throughput with the radix cache on vs off, both measured in this run on SmolLM2-135M.

Workloads:
  few-shot: 32 questions after one shared 8-shot prefix, 8 new tokens each;
  batched decode: 16 prompts x 64 new tokens.
Prints requests/s, tokens/s (prompt + generated), and the on/off ratio.
"""
from __future__ import annotations

import argparse
import time

from radixlang.runtime.engine import Engine

SHOTS = [
    ("What is the capital of France?", "Paris"), ("What color is grass?", "Green"),
    ("How many legs does a cat have?", "Four"), ("What is 2 + 2?", "4"),
    ("Which animal says moo?", "Cow"), ("What is frozen water called?", "Ice"),
    ("What do bees make?", "Honey"), ("Which planet do we live on?", "Earth"),
]
QUESTIONS = [
    "What is the capital of Italy?", "What color is the sky?", "How many wheels does a bicycle have?",
    "What is 3 + 5?", "Which animal barks?", "What falls from clouds?", "What do cows drink?",
    "Which star is closest to Earth?", "What is the opposite of hot?", "How many days are in a week?",
    "What is the capital of Spain?", "What color are bananas?", "How many legs does a spider have?",
    "What is 10 - 3?", "Which bird cannot fly?", "What do we breathe?", "What is the largest ocean?",
    "What is the capital of Japan?", "What color is snow?", "How many hours are in a day?",
    "What is 6 x 7?", "Which animal has a trunk?", "What melts in the sun?", "What gives us milk?",
    "What is the capital of Germany?", "What color are strawberries?", "How many months are in a year?",
    "What is 9 + 1?", "Which insect makes silk?", "What do plants need to grow?",
    "What is the tallest animal?", "What is the capital of Egypt?",
]
DECODE_PROMPTS = [
    "The history of the printing press", "In mathematics, a prime number is", "The mitochondria is",
    "Once upon a time in a small village", "The best way to learn a language is", "Photosynthesis is",
    "The stock market", "A good breakfast", "Volcanoes form when", "The internet was invented",
    "Dogs are loyal because", "The moon affects tides by", "Exercise improves health by",
    "Rain happens when", "Computers store data", "The ocean is salty because",
]


def few_shot_prefix() -> str:
    return "Answer with one word.\n" + "".join(f"Q: {q}\nA: {a}\n" for q, a in SHOTS)


def few_shot_prompts() -> list[str]:
    return [few_shot_prefix() + f"Q: {q}\nA:" for q in QUESTIONS]


def run(engine: Engine, prompts: list[str], max_new: int) -> tuple[float, int, int]:
    t0 = time.perf_counter()
    outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": max_new, "ignore_eos": True})
    elapsed = time.perf_counter() - t0
    engine.check_invariants()
    tokens = sum(o.meta.prompt_tokens + o.meta.completion_tokens for o in outs)
    cached = sum(o.meta.cached_tokens for o in outs)
    return elapsed, tokens, cached


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=2, help="take the best of this many runs")
    args = parser.parse_args()
    workloads = [("few-shot (32 q, 8-shot prefix, 8 tok)", few_shot_prompts(), 8),
                 ("batched decode (16 x 64 tok)", DECODE_PROMPTS, 64)]
    engines = {"on": Engine(device="cpu", kv_cache_tokens=16384),
               "off": Engine(device="cpu", kv_cache_tokens=16384, disable_radix_cache=True)}
    try:
        for name, prompts, max_new in workloads:
            results = {}
            for mode, engine in engines.items():
                best = None
                for _ in range(args.repeats):
                    engine.flush_cache()
                    r = run(engine, prompts, max_new)
                    best = r if best is None or r[0] < best[0] else best
                results[mode] = best
            print(f"\n{name}")
            for mode, (elapsed, tokens, cached) in results.items():
                print(f"  cache {mode:3}: {len(prompts) / elapsed:6.2f} req/s  {tokens / elapsed:8.1f} tok/s  "
                      f"cached prompt tokens {cached}")
            print(f"  speed-up (on/off): {results['off'][0] / results['on'][0]:.2f}x")
    finally:
        for engine in engines.values():
            engine.shutdown()


if __name__ == "__main__":
    main()
