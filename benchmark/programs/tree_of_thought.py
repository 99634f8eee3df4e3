"""Tree of thought: fork into one idea per style, each critiqued on its own branch, then judge (select)
the best and answer. The baseline runs the same tree level by level, each level one batch."""
from __future__ import annotations

import radixlang as rl

from .measure import Run, Workload

SYSTEM = "You are a thoughtful assistant."
STYLES = ["the simplest way", "a creative way", "the cheapest way"]
IDEA_TOKENS, CRITIQUE_TOKENS, ANSWER_TOKENS = 16, 12, 16
GOALS = ["sleep better", "learn to cook", "save money on food", "keep a plant alive", "run a faster mile",
         "remember new words", "tidy a small flat", "make friends in a new city", "drink more water",
         "read more books", "spend less time on the phone", "get up earlier"]


def judge_text(ideas: list[str], critiques: list[str]) -> str:
    lines = [f"{i + 1}. {idea.strip()} (weakness: {c.strip()})" for i, (idea, c) in enumerate(zip(ideas, critiques))]
    return "\nIdeas:\n" + "\n".join(lines) + "\nThe best idea is number "


@rl.function
def tree_of_thought(s, question):
    s += rl.system(SYSTEM)
    s += rl.user(question)
    s += rl.assistant_begin()
    branches = s.fork(len(STYLES))
    for style, branch in zip(STYLES, branches):
        branch += f"Idea ({style}):" + rl.gen("idea", max_tokens=IDEA_TOKENS, stop="\n")
        branch += "\nA weakness of this idea:" + rl.gen("critique", max_tokens=CRITIQUE_TOKENS, stop="\n")
    branches.join()
    s += judge_text(s["idea"], s["critique"]) + rl.select("best", [str(i + 1) for i in range(len(STYLES))])
    s += ". In short:" + rl.gen("answer", max_tokens=ANSWER_TOKENS, stop="\n") + rl.assistant_end()


def make_items(n: int) -> list[dict]:
    return [{"question": f"How can I {GOALS[i % len(GOALS)]}?"} for i in range(n)]


def run_radixlang(backend, items: list[dict]) -> Run:
    states = tree_of_thought.run_batch(items, backend=backend, temperature=0)
    return Run([s["best"] for s in states])


def run_plain(lm, items: list[dict]) -> Run:
    k = len(STYLES)
    heads = [lm.chat_prompt([{"role": "system", "content": SYSTEM}, {"role": "user", "content": it["question"]}])
             for it in items]
    idea_prompts = [h + f"Idea ({style}):" for h in heads for style in STYLES]
    ideas = lm.generate(idea_prompts, IDEA_TOKENS, ["\n"])
    critique_prompts = [p + idea + "\nA weakness of this idea:" for p, idea in zip(idea_prompts, ideas)]
    critiques = lm.generate(critique_prompts, CRITIQUE_TOKENS, ["\n"])
    judges = [h + judge_text(ideas[i * k:(i + 1) * k], critiques[i * k:(i + 1) * k]) for i, h in enumerate(heads)]
    scores = lm.score([(j, [str(i + 1) for i in range(k)]) for j in judges])
    best = [str(max(range(k), key=row.__getitem__) + 1) for row in scores]
    lm.generate([j + b + ". In short:" for j, b in zip(judges, best)], ANSWER_TOKENS, ["\n"])
    return Run(best)


WORKLOAD = Workload("tree of thought", f"fork {len(STYLES)} ideas, critique each, judge with select, answer",
                    make_items, run_radixlang, run_plain)
