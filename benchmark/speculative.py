"""Speculative decoding benchmark: n-gram and draft-model trees vs plain decoding, measured in one run.

Runs on the real SmolLM2-135M (CPU by default), greedy, with a fresh engine per measurement (so no
cache or shared trie carries over from one to the next); plain and speculative runs alternate, and each
keeps its best of `--repeats` (a shared CPU is noisy). For each workload, batch size and drafter it
reports tok/s without and with speculation and their ratio, the mean accepted draft length per verify
step, output tokens per decode step, the drafter's own time as a share of the wall time (draft overhead:
for a draft model, its forwards), and whether the outputs are identical (they must be).

Drafters: `ngram` (NGRAM), `self-k` (SELF: the target's first k layers, --draft-layers), and
`standalone` (STANDALONE) when --draft-model names a second model file with SmolLM2's tokenizer.

Workloads (tests/data/speculative_prompts.json, shared with the end-to-end test):
- extractive: code edits that repeat the code, and summaries that quote their input;
- free: open-ended generation.

    .venv/bin/python benchmark/speculative.py [--workloads extractive free] [--batch-sizes 1 8]
        [--max-new-tokens 128] [--repeats 2]
"""
from __future__ import annotations

import argparse
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from radixlang.runtime.engine import Engine

PROMPTS = json.loads((Path(__file__).parents[1] / "tests" / "data" / "speculative_prompts.json").read_text())
WORKLOADS = {"extractive": PROMPTS["extractive"], "free": PROMPTS["free"]}


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


def drafters(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    out = {"ngram": {"speculative_algorithm": "NGRAM"},
           f"self-{args.draft_layers}": {"speculative_algorithm": "SELF", "speculative_draft_layers": args.draft_layers}}
    if args.draft_model:
        out["standalone"] = {"speculative_algorithm": "STANDALONE", "speculative_draft_model": args.draft_model}
    return out


def measure(args: argparse.Namespace, prompts: list[str], batch: int, options: dict[str, Any]) -> Run:
    with Engine(device=args.device, kv_cache_tokens=32768, **options) as engine:
        chats = [engine.tokenizer.apply_chat_template([{"role": "user", "content": p}]) for p in prompts]
        params = {"temperature": 0, "max_new_tokens": args.max_new_tokens}
        engine.generate("Warm up.", {"temperature": 0, "max_new_tokens": 4})
        drafted = [0.0]
        drafter = engine.scheduler.drafter
        if drafter is not None:  # time the drafter itself: its share of the wall time is its overhead
            propose = drafter.propose

            def timed(wanted):
                t = time.perf_counter()
                try:
                    return propose(wanted)
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
    ap.add_argument("--workloads", nargs="+", choices=list(WORKLOADS), default=list(WORKLOADS))
    ap.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--prompts", type=int, default=3, help="prompts per workload at batch 1 (batch b: b of them)")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--draft-layers", type=int, default=4, help="SELF: the target's first this many layers draft")
    ap.add_argument("--draft-model", default=None, help="STANDALONE: a draft model file sharing the tokenizer")
    ap.add_argument("--device", default="cpu")
    args = ap.parse_args()
    configs = drafters(args)
    print("load average (1, 5, 15 min): %.2f %.2f %.2f" % os.getloadavg())
    print(f"{'workload':<11}{'batch':>6}{'drafter':>12}{'plain tok/s':>13}{'spec tok/s':>12}{'speed-up':>10}"
          f"{'accept len':>12}{'tok/step':>10}{'draft time':>12}{'identical':>11}")
    for name in args.workloads:
        prompts = WORKLOADS[name]
        for batch in args.batch_sizes:
            chosen = prompts[:max(batch, args.prompts if batch == 1 else batch)]
            best: dict[str, Run] = {}
            for _ in range(args.repeats):  # interleaved: every configuration sees the same load
                for label, options in {"plain": {}, **configs}.items():
                    run = measure(args, chosen, batch, options)
                    if label not in best or run.tok_s > best[label].tok_s:
                        best[label] = run
            plain = best["plain"]
            for label in configs:
                spec = best[label]
                print(f"{name:<11}{batch:>6}{label:>12}{plain.tok_s:>13.1f}{spec.tok_s:>12.1f}"
                      f"{spec.tok_s / plain.tok_s:>9.2f}x{spec.accept_length:>12.2f}{spec.tokens_per_step:>10.2f}"
                      f"{spec.draft_share:>11.1%}{str(plain.outputs == spec.outputs):>11}", flush=True)
    print("load average (1, 5, 15 min): %.2f %.2f %.2f" % os.getloadavg())


if __name__ == "__main__":
    main()
