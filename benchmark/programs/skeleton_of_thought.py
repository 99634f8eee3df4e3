"""Skeleton of thought: write a skeleton of short points, fork to expand every point in parallel, join
the expansions into the answer. The baseline expands all points of all items in one batch."""
from __future__ import annotations

import radixlang as rl

from .measure import Run, Workload

POINTS, POINT_TOKENS, EXPAND_TOKENS = 3, 10, 24
TOPICS = ["why people keep pets", "how to prepare for an exam", "what makes a good team",
          "how bicycles changed cities", "why sleep matters", "how to start running", "what a library offers",
          "how to plan a trip", "why forests matter", "how to cook rice", "what makes a good teacher",
          "how to save energy at home"]
INSTRUCTION = f"Give a skeleton of {POINTS} short points, then expand each point in two sentences."


def question(topic: str) -> str:
    return f"Explain {topic}. {INSTRUCTION}"


@rl.function
def skeleton_of_thought(s, topic):
    s += rl.user(question(topic))
    s += rl.assistant_begin()
    s += "Skeleton:\n"
    for i in range(POINTS):
        s += f"{i + 1}." + rl.gen(f"point{i}", max_tokens=POINT_TOKENS, stop="\n") + "\n"
    expansions = s.fork(POINTS)
    for i, branch in enumerate(expansions):
        branch += f"\nExpanding point {i + 1}:" + rl.gen("expansion", max_tokens=EXPAND_TOKENS, stop="\n")
    expansions.join("concate_and_append")
    s += rl.assistant_end()


def make_items(n: int) -> list[dict]:
    return [{"topic": TOPICS[i % len(TOPICS)]} for i in range(n)]


def run_radixlang(backend, items: list[dict]) -> Run:
    states = skeleton_of_thought.run_batch(items, backend=backend, temperature=0)
    return Run([s.text() for s in states])


def run_plain(lm, items: list[dict]) -> Run:
    texts = [lm.chat_prompt([{"role": "user", "content": question(it["topic"])}]) + "Skeleton:\n" for it in items]
    for i in range(POINTS):  # each point follows the ones before it: one batch per point
        texts = [t + f"{i + 1}." for t in texts]
        texts = [t + point + "\n" for t, point in zip(texts, lm.generate(texts, POINT_TOKENS, ["\n"]))]
    branches = [t + f"\nExpanding point {i + 1}:" for t in texts for i in range(POINTS)]
    expansions = lm.generate(branches, EXPAND_TOKENS, ["\n"])
    return Run([t + "".join(b + e for b, e in zip(branches[k * POINTS:], expansions[k * POINTS:(k + 1) * POINTS]))
                for k, t in enumerate(texts)])


WORKLOAD = Workload("skeleton of thought", f"{POINTS} skeleton points, fork to expand each, join",
                    make_items, run_radixlang, run_plain)
