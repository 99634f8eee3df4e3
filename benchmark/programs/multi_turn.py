"""Multi-turn chat: each conversation appends a user turn and generates the reply, turn after turn, so
every turn's prompt extends the previous one. Short turns: one-line messages, short replies. Long turns:
a paragraph per message, longer replies. Latency is per turn. The baseline steps all conversations in
lockstep, one batch per turn, re-reading the whole history each time."""
from __future__ import annotations

import random

import radixlang as rl

from .measure import Run, Workload

SYSTEM = "You are a helpful assistant."
SHORT_REPLY, LONG_TURNS, LONG_REPLY = 12, 3, 24
SUBJECTS = ["the ocean", "volcanoes", "bees", "the moon", "trains", "bread", "rivers", "chess", "owls", "glass"]
SHORT_ASKS = ["Tell me one fact about {}.", "Why is that interesting?", "Give another example."]
SENTENCES = ["{} has been studied for a very long time by people from many different countries.",
             "Some of the questions about {} are simple, while others remain open after centuries of work.",
             "Teachers often use {} as an example because almost everyone has seen it at least once.",
             "There are many books, films and museum rooms that try to explain {} to a wide audience.",
             "Scientists measure {} with instruments that were invented for quite different purposes.",
             "Children ask surprising questions about {}, and the answers are rarely as simple as they seem."]


def long_message(rng: random.Random, subject: str, turn: int) -> str:
    text = " ".join(rng.choice(SENTENCES).format(subject) for _ in range(6))
    return f"Here are my notes, part {turn + 1}. {text} Summarise these notes in two sentences."


def make_short(n: int) -> list[dict]:
    return [{"turns": [ask.format(SUBJECTS[i % len(SUBJECTS)]) for ask in SHORT_ASKS], "max_tokens": SHORT_REPLY}
            for i in range(n)]


def make_long(n: int) -> list[dict]:
    rng = random.Random(0)
    return [{"turns": [long_message(rng, SUBJECTS[i % len(SUBJECTS)], t) for t in range(LONG_TURNS)],
             "max_tokens": LONG_REPLY}
            for i in range(n)]


def make_sessions(n: int, turns: int = 4) -> list[dict]:
    """`n` chat sessions of the long-turn chat's messages, each a user with their own report and notes, as a
    server's concurrent conversations are: no two share more than the system prompt and a few words."""
    sessions = []
    for i in range(n):
        rng, subject = random.Random(i), SUBJECTS[i % len(SUBJECTS)]
        messages = [long_message(rng, subject, t) for t in range(turns)]
        messages[0] = f"I am writing report number {i + 1}, on {subject}. {messages[0]}"
        sessions.append({"turns": messages, "max_tokens": LONG_REPLY})
    return sessions


@rl.function
def chat(s, turns, max_tokens):
    s += rl.system(SYSTEM)
    for i, message in enumerate(turns):
        s += rl.user(message)
        s += rl.assistant(rl.gen(f"reply{i}", max_tokens=max_tokens))


def run_radixlang(backend, items: list[dict]) -> Run:
    states = chat.run_batch(items, backend=backend, temperature=0)
    names = [f"reply{i}" for i in range(len(items[0]["turns"]))]
    return Run([[s[n] for n in names] for s in states],
               [s.get_meta_info(n)["e2e_latency"] for s in states for n in names])


def run_plain(lm, items: list[dict]) -> Run:
    histories = [[{"role": "system", "content": SYSTEM}] for _ in items]
    for turn in range(len(items[0]["turns"])):
        for history, it in zip(histories, items):
            history.append({"role": "user", "content": it["turns"][turn]})
        replies = lm.generate([lm.chat_prompt(h) for h in histories], items[0]["max_tokens"])
        for history, reply in zip(histories, replies):
            history.append({"role": "assistant", "content": reply})
    return Run([[m["content"] for m in h if m["role"] == "assistant"] for h in histories])


SHORT = Workload("chat, short turns", f"{len(SHORT_ASKS)} one-line turns, {SHORT_REPLY}-token replies",
                 make_short, run_radixlang, run_plain, latency=True)
LONG = Workload("chat, long turns", f"{LONG_TURNS} turns of 6 sentences each, {LONG_REPLY}-token replies",
                make_long, run_radixlang, run_plain, latency=True)
