"""Few-shot QA with run_batch: arithmetic questions after the cache benchmark's 8-shot prefix."""
from __future__ import annotations

import random

import radixlang as rl

from ..radix_cache import few_shot_prefix
from .measure import Run, Workload

MAX_TOKENS = 8


@rl.function
def few_shot_qa(s, question):
    s += few_shot_prefix() + "Q: " + question + "\nA:" + rl.gen("answer", max_tokens=MAX_TOKENS, stop="\n")


def make_items(n: int) -> list[dict]:
    rng = random.Random(0)
    items = []
    for _ in range(n):
        a, b = rng.randint(1, 9), rng.randint(1, 9)
        items.append({"question": f"What is {a} + {b}?", "answer": str(a + b)})
    return items


def run_radixlang(backend, items: list[dict]) -> Run:
    states = few_shot_qa.run_batch([{"question": it["question"]} for it in items], backend=backend, temperature=0)
    return Run([s["answer"] for s in states])


def run_plain(lm, items: list[dict]) -> Run:
    prompts = [few_shot_prefix() + "Q: " + it["question"] + "\nA:" for it in items]
    return Run(lm.generate(prompts, MAX_TOKENS, ["\n"]))


def first_word(text: str) -> str:
    words = text.strip().split()
    return words[0].strip(".,!?").lower() if words else ""


def accuracy(items: list[dict], answers: list[str]) -> float:
    return sum(first_word(a) == it["answer"].lower() for it, a in zip(items, answers)) / len(items)


WORKLOAD = Workload("few-shot QA", "run_batch over questions after one shared 8-shot prefix",
                    make_items, run_radixlang, run_plain, accuracy)
