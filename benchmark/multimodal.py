"""Image workloads with the caches that spare image work on and off, all measured in this run.

Workloads (on a LLaVA folder given with --model, else a random-weight LLaVA built here: same shapes of
work, meaningless text):
  multi-turn chat: each turn resends the whole conversation, image included, as chat APIs do;
  many questions: N questions about one image, sent together.
Configurations: both caches (radix prefix + image embeddings), radix only (image_cache_mb=0), image
cache only (radix off: spans are prefilled again but not re-encoded), and neither. Prints seconds,
vision-tower encodes and cached prompt tokens per configuration, and time ratios against "neither".
Runs interleave the configurations and keep each one's best, so a loaded machine skews them alike.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

from PIL import Image, ImageDraw

from radixlang.runtime.engine import Engine
from radixlang.testing.random_llava import write_random_llava

CONFIGS = {
    "both caches": {},
    "radix only": {"image_cache_mb": 0},
    "image cache only": {"disable_radix_cache": True},
    "neither": {"image_cache_mb": 0, "disable_radix_cache": True},
}
QUESTIONS = ["What is in the picture?", "What colour is the circle?", "How many shapes are there?",
             "Is it day or night?", "What is in the corner?", "Describe the background.",
             "Is anything moving?", "What would you title it?"]
GEN = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}


def picture() -> Image.Image:
    image = Image.new("RGB", (400, 300), (30, 60, 200))
    ImageDraw.Draw(image).ellipse((140, 80, 260, 200), fill=(220, 30, 30))
    return image


def multi_turn(engine: Engine, image: Image.Image, turns: int) -> tuple[int, int]:
    history = "USER: <image>\n"
    cached = prompt = 0
    for question in QUESTIONS[:turns]:
        history += question + " ASSISTANT:"
        out = engine.generate(history, GEN, image_data=[image])
        history += out.text + "\nUSER: "
        cached, prompt = cached + out.meta.cached_tokens, prompt + out.meta.prompt_tokens
    return cached, prompt


def many_questions(engine: Engine, image: Image.Image, n: int) -> tuple[int, int]:
    prompts = [f"USER: <image>\n{QUESTIONS[i % len(QUESTIONS)]} ASSISTANT:" for i in range(n)]
    outs = engine.generate(prompts, GEN, image_data=[[image]] * n)
    return sum(o.meta.cached_tokens for o in outs), sum(o.meta.prompt_tokens for o in outs)


def measure(engine: Engine, workload, image: Image.Image, size: int) -> tuple[float, int, int, int]:
    engine.flush_cache()
    engine.image_encoder.cache.clear()  # cold start: every configuration encodes its first image
    before = engine.image_encoder.counters.encodes
    started = time.perf_counter()
    cached, prompt = workload(engine, image, size)
    elapsed = time.perf_counter() - started
    engine.check_invariants()
    return elapsed, engine.image_encoder.counters.encodes - before, cached, prompt


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", help="a LLaVA HF folder; default: a random-weight LLaVA")
    parser.add_argument("--turns", type=int, default=8)
    parser.add_argument("--questions", type=int, default=16)
    parser.add_argument("--repeats", type=int, default=3, help="interleaved rounds; each config keeps its best")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        model = args.model or str(write_random_llava(Path(tmp) / "random-llava"))
        engines = {name: Engine(model, kv_cache_tokens=16384, **opts) for name, opts in CONFIGS.items()}
        image = picture()
        workloads = {"multi-turn chat": (multi_turn, args.turns), "many questions": (many_questions, args.questions)}
        for title, (workload, size) in workloads.items():
            best: dict[str, tuple] = {}
            for _ in range(args.repeats):
                for name, engine in engines.items():
                    result = measure(engine, workload, image, size)
                    if name not in best or result[0] < best[name][0]:
                        best[name] = result
            print(f"\n{title} ({size} requests, one image)")
            print(f"{'config':<18}{'seconds':>9}{'encodes':>9}{'cached/prompt tokens':>24}{'speedup':>9}")
            base = best["neither"][0]
            for name, (elapsed, encodes, cached, prompt) in best.items():
                print(f"{name:<18}{elapsed:>9.3f}{encodes:>9}{f'{cached}/{prompt}':>24}{base / elapsed:>8.2f}x")
        for engine in engines.values():
            engine.shutdown()


if __name__ == "__main__":
    main()
