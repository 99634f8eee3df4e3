"""A ReAct agent replaying a fixed trace of tool calls: at each step the model writes a thought, then the
trace's action and observation are appended; finally the model answers. Accuracy: the final answer
equals the trace's (it appears in the last observation). The baseline steps all agents in lockstep,
one batch per step."""
from __future__ import annotations

import radixlang as rl

from .measure import Run, Workload

THOUGHT_TOKENS, ANSWER_TOKENS = 20, 8
PLACES = [("Lyon", "France", "Paris"), ("Osaka", "Japan", "Tokyo"), ("Porto", "Portugal", "Lisbon"),
          ("Hamburg", "Germany", "Berlin"), ("Milan", "Italy", "Rome"), ("Seville", "Spain", "Madrid"),
          ("Krakow", "Poland", "Warsaw"), ("Bergen", "Norway", "Oslo"), ("Graz", "Austria", "Vienna"),
          ("Gothenburg", "Sweden", "Stockholm"), ("Cork", "Ireland", "Dublin"), ("Alexandria", "Egypt", "Cairo")]
HEADER = ("Answer the question with the tools lookup[term] and finish[answer]. Think before each action.\n\n"
          "Question: What is the capital of the country where Toronto is?\n"
          "Thought: I need to find the country of Toronto.\nAction: lookup[Toronto]\n"
          "Observation: Toronto is a city in Canada.\n"
          "Thought: Now I need the capital of Canada.\nAction: lookup[Canada]\n"
          "Observation: The capital of Canada is Ottawa.\n"
          "Thought: I know the answer.\nAction: finish[Ottawa]\n\n")


@rl.function
def react(s, question, trace):
    s += HEADER + "Question: " + question + "\n"
    for i, (action, observation) in enumerate(trace):
        s += "Thought:" + rl.gen(f"thought{i}", max_tokens=THOUGHT_TOKENS, stop="\n") + "\n"
        s += f"Action: {action}\nObservation: {observation}\n"
    s += "Thought:" + rl.gen("final", max_tokens=THOUGHT_TOKENS, stop="\n") + "\n"
    s += "Action: finish[" + rl.gen("answer", max_tokens=ANSWER_TOKENS, stop=["]", "\n"]) + "]\n"


def make_items(n: int) -> list[dict]:
    items = []
    for i in range(n):
        city, country, capital = PLACES[i % len(PLACES)]
        trace = [(f"lookup[{city}]", f"{city} is a city in {country}."),
                 (f"lookup[{country}]", f"The capital of {country} is {capital}.")]
        items.append({"question": f"What is the capital of the country where {city} is?", "trace": trace,
                      "answer": capital})
    return items


def run_radixlang(backend, items: list[dict]) -> Run:
    states = react.run_batch([{"question": it["question"], "trace": it["trace"]} for it in items],
                             backend=backend, temperature=0)
    names = [f"thought{i}" for i in range(len(items[0]["trace"]))] + ["final", "answer"]
    return Run([s["answer"] for s in states],
               [s.get_meta_info(name)["e2e_latency"] for s in states for name in names])


def run_plain(lm, items: list[dict]) -> Run:
    texts = [HEADER + "Question: " + it["question"] + "\n" for it in items]
    for step in range(len(items[0]["trace"])):
        texts = [t + "Thought:" for t in texts]
        thoughts = lm.generate(texts, THOUGHT_TOKENS, ["\n"])
        texts = [t + th + "\nAction: {}\nObservation: {}\n".format(*it["trace"][step])
                 for t, th, it in zip(texts, thoughts, items)]
    texts = [t + "Thought:" for t in texts]
    texts = [t + th + "\nAction: finish[" for t, th in zip(texts, lm.generate(texts, THOUGHT_TOKENS, ["\n"]))]
    return Run(lm.generate(texts, ANSWER_TOKENS, ["]", "\n"]))


def accuracy(items: list[dict], answers: list[str]) -> float:
    return sum(a.strip().lower() == it["answer"].lower() for it, a in zip(items, answers)) / len(items)


WORKLOAD = Workload("ReAct agent", "2 replayed tool calls per agent, a thought before each, then the answer",
                    make_items, run_radixlang, run_plain, accuracy, latency=True)
