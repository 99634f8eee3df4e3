"""HellaSwag-style select: pick the ending of a short scene among 4 (the true one and 3 endings of other
scenes), after two solved examples. Accuracy is against the generated items' answer key."""
from __future__ import annotations

import random

import radixlang as rl

from .measure import Run, Workload

PEOPLE = [("Tom", "Tom"), ("Anna", "Anna"), ("A young man", "the young man"), ("The old woman", "the old woman"),
          ("A girl", "the girl"), ("The chef", "the chef"), ("A boy", "the boy")]  # (first mention, again)
SCENES = [  # (context after a person, its true ending)
    ("fills a glass with cold water from the tap.", "drinks the water slowly."),
    ("puts on running shoes and steps outside.", "starts jogging down the street."),
    ("cracks two eggs into a hot pan.", "stirs the eggs with a fork until they are cooked."),
    ("opens an umbrella as the rain begins.", "walks home under the umbrella."),
    ("sits down at the piano and opens the music book.", "plays a slow song on the piano."),
    ("picks up a toothbrush and squeezes out some toothpaste.", "brushes the teeth carefully."),
    ("climbs into the car and fastens the seat belt.", "starts the engine and drives away."),
    ("takes a book from the shelf and sits in a chair.", "reads the first page of the book."),
    ("grabs a broom in the dusty kitchen.", "sweeps the floor clean."),
    ("buys a ticket at the station.", "gets on the train."),
    ("plants a small seed in a pot of soil.", "waters the pot."),
    ("throws a ball to the dog in the park.", "watches the dog run after the ball."),
    ("turns on the shower and waits for warm water.", "steps into the shower and washes."),
    ("writes a letter and folds it.", "puts the letter in an envelope."),
    ("dips a brush into blue paint.", "paints the wall blue."),
    ("sharpens a pencil at the desk.", "writes notes in a notebook."),
]
SHOTS = ("Pick the most sensible ending.\n\n"
         "The man lights a match near the candle. Then the man lights the candle.\n\n"
         "Mia pours coffee into a mug. Then Mia drinks the coffee.\n\n")


@rl.function
def hellaswag(s, context, endings):
    s += SHOTS + context + rl.select("ending", endings)


def make_items(n: int) -> list[dict]:
    rng = random.Random(0)
    items = []
    for i in range(n):
        context, ending = SCENES[i % len(SCENES)]
        others = rng.sample([e for c, e in SCENES if e != ending], 3)
        endings = [" " + e for e in [ending, *others]]
        rng.shuffle(endings)
        first, again = rng.choice(PEOPLE)
        items.append({"context": f"{first} {context} Then {again}", "endings": endings,
                      "label": endings.index(" " + ending)})
    return items


def run_radixlang(backend, items: list[dict]) -> Run:
    states = hellaswag.run_batch([{"context": it["context"], "endings": it["endings"]} for it in items],
                                 backend=backend, temperature=0)
    return Run([it["endings"].index(s["ending"]) for it, s in zip(items, states)])


def run_plain(lm, items: list[dict]) -> Run:
    scores = lm.score([(SHOTS + it["context"], it["endings"]) for it in items])
    return Run([max(range(len(row)), key=row.__getitem__) for row in scores])


def accuracy(items: list[dict], answers: list[int]) -> float:
    return sum(a == it["label"] for it, a in zip(items, answers)) / len(items)


WORKLOAD = Workload("HellaSwag select", "select over 4 endings after a shared 2-shot prefix",
                    make_items, run_radixlang, run_plain, accuracy)
