"""Speculative decoding benchmark: n-gram draft trees vs plain decoding, measured in the same run.

Runs on the real SmolLM2-135M (CPU by default), greedy, with a fresh engine per measurement (so no
cache or shared trie carries over from one to the next); plain and speculative runs alternate, and each
keeps its best of `--repeats` (a shared CPU is noisy). For each workload and batch size it reports
tok/s without and with speculation and their ratio, the mean accepted draft length per verify step,
output tokens per decode step, the drafter's own time as a share of the wall time (draft overhead),
and whether the outputs are identical (they must be).

Workloads:
- extractive: code edits that repeat the code, and summaries that quote their input;
- free: open-ended generation.

    .venv/bin/python benchmark/speculative.py [--batch-sizes 1 8] [--max-new-tokens 128] [--repeats 2]
"""
from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from radixlang.runtime.engine import Engine

CODE = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''
CLASS = '''class Stack:
    def __init__(self):
        self.items = []

    def push(self, item):
        self.items.append(item)

    def pop(self):
        if not self.items:
            raise IndexError("pop from empty stack")
        return self.items.pop()

    def peek(self):
        return self.items[-1] if self.items else None
'''
ARTICLE = ("The radix cache keeps every prompt prefix it has computed, so a second request that starts with "
           "the same system prompt reuses its keys and values instead of recomputing them. When memory runs "
           "short, eviction removes the least recently used leaves first, and a prefix that a running request "
           "still uses is locked so that it cannot be evicted.")
EXTRACTIVE = [
    "Rewrite this function with the variable `out` renamed to `result`, changing nothing else.\n\n" + CODE,
    "Add a docstring to each method of this class and repeat the rest of the code unchanged.\n\n" + CLASS,
    "Quote the sentence of this text that explains eviction, then the one about locking.\n\n" + ARTICLE,
    "Repeat the following text exactly.\n\n" + ARTICLE,
    "Rewrite this function to use the name `width` instead of `window`, changing nothing else.\n\n" + CODE,
    "Rename the class in this code to `LifoStack` and repeat the code.\n\n" + CLASS,
    "Summarize this text, quoting its key sentences word for word.\n\n" + ARTICLE,
    "Copy this code and add type hints to the function signature.\n\n" + CODE,
]
FREE = [
    "Write a short story about a lighthouse keeper who finds a message in a bottle.",
    "Explain why the sky is blue to a ten-year-old.",
    "Give me five ideas for a weekend trip in the mountains, with one sentence each.",
    "What are the pros and cons of working from home?",
    "Describe the taste of a ripe mango to someone who has never had one.",
    "Write a poem about autumn rain.",
    "How does a bicycle stay upright while moving?",
    "Plan a three-course dinner for a friend who is vegetarian.",
]
WORKLOADS = {"extractive": EXTRACTIVE, "free": FREE}


@dataclass(slots=True)
class Run:
    seconds: float
    tokens: int
    outputs: list[list[int]]
    accept_length: float = 0.0
    tokens_per_step: float = 0.0
    draft_share: float = 0.0

    @property
    def tok_s(self) -> float:
        return self.tokens / self.seconds


def measure(args: argparse.Namespace, prompts: list[str], batch: int, speculative: bool) -> Run:
    options = {"speculative_algorithm": "NGRAM"} if speculative else {}
    with Engine(device=args.device, kv_cache_tokens=32768, **options) as engine:
        chats = [engine.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
        params = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
        engine.generate("Warm up.", {"temperature": 0, "max_new_tokens": 4})
        drafted = [0.0]
        drafter = engine.scheduler.drafter
        if drafter is not None:  # time the drafter itself: its share of the wall time is its overhead
            propose = drafter.propose

            def timed(req, room):
                t = time.perf_counter()
                try:
                    return propose(req, room)
                finally:
                    drafted[0] += time.perf_counter() - t

            drafter.propose = timed
        before = engine.stats()
        start = time.perf_counter()
        outputs = []
        for i in range(0, len(chats), batch):
            outputs += engine.generate(chats[i:i + batch], params)
        seconds = time.perf_counter() - start
        after = engine.stats()
    diff = {k: after[k] - before[k] for k in after if k.endswith("_total")}
    tokens = sum(len(o.output_ids) for o in outputs)
    verifies = diff["spec_verify_steps_total"]
    return Run(seconds, tokens, [o.output_ids for o in outputs],
               accept_length=diff["spec_accepted_tokens_total"] / verifies if verifies else 0.0,
               tokens_per_step=tokens / max(1, diff["steps_total"]), draft_share=drafted[0] / seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=3, help="prompts per workload at batch 1 (batch b: b of them)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    print(f"{'workload':<11}{'batch':>6}{'plain tok/s':>13}{'spec tok/s':>12}{'speed-up':>10}"
          f"{'accept len':>12}{'tok/step':>10}{'draft time':>12}{'identical':>11}")
    for name, prompts in WORKLOADS.items():
        for batch in args.batch_sizes:
            chosen = prompts[:max(batch, args.prompts if batch == 1 else batch)]
            runs = [(measure(args, chosen, batch, False), measure(args, chosen, batch, True))
                    for _ in range(args.repeats)]
            plain = max((r[0] for r in runs), key=lambda r: r.tok_s)
            spec = max((r[1] for r in runs), key=lambda r: r.tok_s)
            print(f"{name:<11}{batch:>6}{plain.tok_s:>13.1f}{spec.tok_s:>12.1f}{spec.tok_s / plain.tok_s:>9.2f}x"
                  f"{spec.accept_length:>12.2f}{spec.tokens_per_step:>10.2f}{spec.draft_share:>11.1%}"
                  f"{str(plain.outputs == spec.outputs):>11}", flush=True)


if __name__ == "__main__":
    main()
