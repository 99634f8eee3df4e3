"""One program run remotely (remote=True: the whole traced program in one POST /v1/programs) against
the same program through the same server making one HTTP call per primitive (rl.Endpoint). Programs
run one after another against a server on the radix-cache engine; latency is per program."""
from __future__ import annotations

import time

import radixlang as rl

from .measure import Run, Variant, Workload
from .systems import RADIXLANG

QUESTIONS = 2
REMOTE, PER_CALL = "radixlang, remote program", "radixlang, one HTTP call per primitive"
IN_PROCESS = "radixlang, in-process (no HTTP)"
TOPICS = ["rivers", "planets", "birds", "music", "bread", "trains", "mountains", "colours", "oceans", "insects"]


@rl.function
def quiz(s, topic):
    s += rl.system("You are a quiz master.")
    s += rl.user("Ask and answer short questions about " + topic + ".")
    s += rl.assistant_begin()
    for i in range(QUESTIONS):
        s += f"Question {i + 1}:" + rl.gen(f"q{i}", max_tokens=16, stop="\n")
        s += "\nAnswer:" + rl.gen(f"a{i}", max_tokens=8, stop="\n")
        s += "\nSure: " + rl.select(f"sure{i}", ["yes", "no"]) + "\n"
    s += rl.assistant_end()


def make_items(n: int) -> list[dict]:
    return [{"topic": TOPICS[i % len(TOPICS)]} for i in range(n)]


def run_each(backend, items: list[dict], remote: bool) -> Run:
    answers, latencies = [], []
    for it in items:
        started = time.perf_counter()
        state = quiz.run(topic=it["topic"], backend=backend, remote=remote, temperature=0)
        answers.append(state.text())
        latencies.append(time.perf_counter() - started)
    return Run(answers, latencies)


def run_radixlang(backend, items: list[dict]) -> Run:
    return run_each(backend, items, remote=False)


def over_http(systems, items: list[dict], default: list[Variant]) -> list[Variant]:
    endpoint = rl.Endpoint(systems.server_url(RADIXLANG))
    engine = systems.engine(RADIXLANG)
    return [Variant(REMOTE, lambda: run_each(endpoint, items, remote=True), engine=engine),
            Variant(PER_CALL, lambda: run_each(endpoint, items, remote=False), engine=engine),
            Variant(IN_PROCESS, lambda: run_radixlang(rl.EngineBackend(engine), items), engine=engine)]


WORKLOAD = Workload("remote program", f"{3 * QUESTIONS} primitives per program over HTTP, programs in sequence",
                    make_items, run_radixlang, variants=over_http, latency=True)
