"""JSON extraction with a schema: one constrained gen per document, with jump-forward (the default) and
without it. The baseline has no constrained decoding: it is prompted with the schema, starts the object
with "{" and parses what it writes. Accuracy: share of fields equal to the document's (invalid: none)."""
from __future__ import annotations

import json
import random

import jsonschema

import radixlang as rl

from .measure import Run, Variant, Workload

MAX_TOKENS = 64
NO_JUMP_FORWARD = "radixlang, no jump-forward"
NAMES = ["Maria Lopez", "Kenji Watanabe", "Amara Okafor", "Tom Becker", "Priya Sharma", "Lucas Martin",
         "Fatima Zahra", "Marco Rossi", "Aiko Tanaka", "John Smith", "Elena Petrova", "Omar Haddad"]
CITIES = ["Madrid", "Osaka", "Lagos", "Hamburg", "Mumbai", "Lyon", "Casablanca", "Naples", "Vienna", "Denver"]
JOBS = ["engineer", "chef", "doctor", "teacher", "student", "artist"]
TEMPLATES = ["{name}, {age}, works as a {job} in {city}.",
             "At {age}, {name} is a {job} living in {city}.",
             "{name} is a {age} year old {job} from {city}."]
SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string", "maxLength": 32},
                   "age": {"type": "integer", "minimum": 0, "maximum": 120},
                   "city": {"type": "string", "maxLength": 24}, "job": {"enum": JOBS}},
    "required": ["name", "age", "city", "job"],
    "additionalProperties": False,
}
INSTRUCTION = "Extract the person in this text as JSON with the keys name, age, city and job (one of {}).\n\nText: "


def prompt_text(document: str) -> str:
    return INSTRUCTION.format(", ".join(JOBS)) + document


@rl.function
def extract(s, document):
    s += rl.user(prompt_text(document))
    s += rl.assistant(rl.gen("json", max_tokens=MAX_TOKENS, json_schema=SCHEMA))


def make_items(n: int) -> list[dict]:
    rng = random.Random(0)
    items = []
    for i in range(n):
        record = {"name": NAMES[i % len(NAMES)], "age": rng.randint(18, 80), "city": rng.choice(CITIES),
                  "job": rng.choice(JOBS)}
        items.append({"document": rng.choice(TEMPLATES).format(**record), "record": record})
    return items


def run_radixlang(backend, items: list[dict]) -> Run:
    states = extract.run_batch([{"document": it["document"]} for it in items], backend=backend, temperature=0)
    return Run([s["json"] for s in states])


def run_plain(lm, items: list[dict]) -> Run:
    prompts = [lm.chat_prompt([{"role": "user", "content": prompt_text(it["document"])}]) + "{" for it in items]
    return Run(["{" + text + "}" for text in lm.generate(prompts, MAX_TOKENS, ["}"])])


def fields_right(text: str, record: dict) -> int:
    try:
        value = json.loads(text)
        jsonschema.validate(value, SCHEMA)
    except (json.JSONDecodeError, jsonschema.ValidationError):
        return 0
    return sum(value[k] == v for k, v in record.items())


def accuracy(items: list[dict], answers: list[str]) -> float:
    return sum(fields_right(a, it["record"]) for it, a in zip(items, answers)) / (len(items) * len(SCHEMA["required"]))


def with_jump_forward_off(systems, items: list[dict], default: list[Variant]) -> list[Variant]:
    engine = systems.engine(NO_JUMP_FORWARD, disable_jump_forward=True)
    off = Variant(NO_JUMP_FORWARD, lambda: run_radixlang(rl.EngineBackend(engine), items), engine=engine)
    return [default[0], off, *default[1:]]


WORKLOAD = Workload("JSON extraction", "one json_schema gen per document; jump-forward on vs off",
                    make_items, run_radixlang, run_plain, accuracy, with_jump_forward_off)
