"""Constrained decoding benchmark: compile time, per-token mask time, jump-forward share and speed-up.

Runs on the real SmolLM2-135M (CPU by default). Everything compared is measured in this run:
- compile time of JSON-object regexes over the 49k vocabulary (DFA + token index), budget 1 s;
  masks are built per DFA state on its first visit, so that cost shows up in the "cold" mask times;
- compile time of JSON-like regex templates with Unicode fields (SGLang's character regex with its
  `[\w\d\s]{1,16}` fields, `\w+`, `[^"]{1,64}`): the DFA alone and the whole constraint, first in
  the process (UTF-8 decoders and `\w` tables not cached yet) and warm, against the same template
  with ASCII fields;
- per-token mask time (p50 / p99) while decoding, cold (fresh compile) and warm: JSON schema
  (regex path) and a Lark JSON grammar;
- share of output tokens that jump-forward appended instead of decoding;
- end-to-end time of a JSON extraction workload with jump-forward vs the same constraint without it,
  the greedy-output agreement between the two, and the share of outputs that validate;
- what a batch of constrained requests adds to a decode step (`--batch 64`): the same prompts, the same
  number of decode steps (ignore_eos, a constraint that never completes), with and without a constraint,
  alternated and the best of each kept (masks warm: the constraint's states are visited in the first round).

    .venv/bin/python benchmark/constrained_decoding.py [--prompts 12] [--device cpu] [--batch 64] [--only-batch]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jsonschema
import numpy as np

from radixlang.runtime.constrained.compiler import ConstraintCompiler
from radixlang.runtime.constrained.grammar.constraint import JSON_GRAMMAR, GrammarConstraint
from radixlang.runtime.constrained.jump_forward import JumpForwarder
from radixlang.runtime.constrained.masks.vocab import TokenVocab
from radixlang.runtime.constrained.matcher import Matcher, RegexConstraint
from radixlang.runtime.constrained.regex.automaton import compile_dfa
from radixlang.runtime.constrained.regex.regex_parser import parse_regex
from radixlang.runtime.engine import Engine
from radixlang.runtime.execution import sampler

COMPACT_SCHEMA = {  # unbounded strings: the usual JSON-object regex
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}, "email": {"type": "string"},
                   "tags": {"type": "array", "items": {"type": "string"}}, "active": {"type": "boolean"}},
    "required": ["name", "age", "email", "tags", "active"],
}
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "occupation": {"type": "string", "maxLength": 40},
        "city": {"type": "string", "maxLength": 40},
        "country": {"type": "string", "maxLength": 40},
        "employed": {"type": "boolean"},
    },
    "required": ["name", "age", "occupation", "city", "country", "employed"],
}
# SGLang's character-generator regex; FIELD is its string fields' pattern (theirs: [\w\d\s]{1,16})
CHARACTER_TEMPLATE = (
    r'\{\n    "name": "FIELD",\n    "house": "(Gryffindor|Slytherin|Ravenclaw|Hufflepuff)",\n'
    r'    "blood status": "(Pure-blood|Half-blood|Muggle-born)",\n'
    r'    "occupation": "(student|teacher|auror|ministry of magic|death eater|order of the phoenix)",\n'
    r'    "wand": \{\n        "wood": "FIELD",\n        "core": "FIELD",\n'
    r'        "length": [0-9]{1,2}\.[0-9]{0,2}\n    \},\n    "alive": "(Alive|Deceased)",\n'
    r'    "patronus": "FIELD",\n    "bogart": "FIELD"\n\}'
)
REGEX_TEMPLATES = {  # name -> (Unicode template, the same with ASCII fields)
    "character regex, [\\w\\d\\s]{1,16} fields": (CHARACTER_TEMPLATE.replace("FIELD", r"[\w\d\s]{1,16}"),
                                                CHARACTER_TEMPLATE.replace("FIELD", "[a-zA-Z0-9 ]{1,16}")),
    "\\w+ fields": (r'\{"name": "\w+", "city": "[\w ]+", "job": "[\w ]+", "id": [0-9]{1,6}\}',
                   r'\{"name": "[a-zA-Z0-9_]+", "city": "[a-zA-Z0-9_ ]+", "job": "[a-zA-Z0-9_ ]+", "id": [0-9]{1,6}\}'),
    '[^"]{1,64} fields': (r'\{"title": "[^"]{1,64}", "author": "[^"]{1,64}", "year": [0-9]{4}\}',
                          r'\{"title": "[ !#-~]{1,64}", "author": "[ !#-~]{1,64}", "year": [0-9]{4}\}'),
}
TEXTS = [
    "Maria Lopez is a 34 year old software engineer living in Madrid, Spain. She works at a startup.",
    "At 71, retired teacher Tom Becker still bikes around Hamburg, Germany every morning.",
    "The violinist Aiko Tanaka (age 25) moved to Vienna, Austria last spring and plays in an orchestra.",
    "Chef Marco Rossi, 45, runs a small restaurant in Naples, Italy.",
    "Priya Sharma is a 29-year-old doctor at a hospital in Mumbai, India.",
    "John Smith, a 52 year old unemployed carpenter, lives in Denver, USA.",
    "Fatima Zahra, 38, teaches mathematics at a school in Casablanca, Morocco.",
    "Lucas Martin is 19 and studies physics in Lyon, France; he is not working.",
    "The nurse Olga Ivanova, aged 41, works night shifts in Kazan, Russia.",
    "Kwame Mensah (60) is a farmer near Kumasi, Ghana.",
    "Emma Wilson, a 27 year old journalist, reports from Sydney, Australia.",
    "Carlos Silva is a 33-year-old pilot based in Lisbon, Portugal.",
]


class MaskTimer:
    """Times every token-mask lookup of the constraints (LRU hits and first-visit builds alike)."""

    CLASSES = (RegexConstraint, GrammarConstraint)

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._orig = [cls.allowed for cls in self.CLASSES]

    def __enter__(self) -> "MaskTimer":
        samples = self.samples

        def timed(orig):  # noqa: ANN001, ANN202
            def allowed(constraint, state):  # noqa: ANN001, ANN202
                t = time.perf_counter()
                out = orig(constraint, state)
                samples.append(time.perf_counter() - t)
                return out
            return allowed

        for cls, orig in zip(self.CLASSES, self._orig):
            cls.allowed = timed(orig)
        return self

    def __exit__(self, *exc: object) -> None:
        for cls, orig in zip(self.CLASSES, self._orig):
            cls.allowed = orig

    def report(self, name: str) -> str:
        ms = np.array(self.samples) * 1e3
        return (f"{name}: {len(ms)} masks, p50 {np.percentile(ms, 50):.3f} ms, p99 {np.percentile(ms, 99):.3f} ms, "
                f"max {ms.max():.1f} ms")


def compile_times(engine: Engine, repeats: int = 3) -> dict[str, float]:
    """Median cold compile time (fresh compiler, vocabulary prepared) per constraint."""
    vocab = TokenVocab.from_tokenizer(engine.tokenizer, engine.vocab_size)
    specs = {"JSON-object regex, unbounded strings": ("json_schema", COMPACT_SCHEMA),
             "JSON-object regex, bounded strings (benchmark schema)": ("json_schema", SCHEMA),
             "Lark JSON grammar": ("grammar", JSON_GRAMMAR)}
    times: dict[str, list[float]] = {name: [] for name in specs}
    for _ in range(repeats):
        for name, (kind, spec) in specs.items():
            compiler = ConstraintCompiler(lambda: vocab)
            t = time.perf_counter()
            compiler.compile(kind, spec)
            times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def template_times(engine: Engine, repeats: int = 3) -> None:
    """Prints, per regex template: DFA states, DFA and whole-constraint compile times (first in this
    process, then the median warm), and the ratio to the same template with ASCII fields."""
    vocab = TokenVocab.from_tokenizer(engine.tokenizer, engine.vocab_size)

    def timed(fn) -> tuple[float, object]:  # noqa: ANN001
        t = time.perf_counter()
        out = fn()
        return time.perf_counter() - t, out

    for name, (regex, ascii_regex) in REGEX_TEMPLATES.items():
        row = {}
        for label, spec in (("unicode", regex), ("ascii", ascii_regex)):
            runs = [(timed(lambda: compile_dfa([parse_regex(spec)])),
                     timed(lambda: ConstraintCompiler(lambda: vocab).compile("regex", spec))) for _ in range(repeats + 1)]
            dfa = runs[0][0][1]
            row[label] = (dfa.num_states, runs[0][0][0], runs[0][1][0],
                          statistics.median(r[0][0] for r in runs[1:]), statistics.median(r[1][0] for r in runs[1:]))
        (states, dfa_first, full_first, dfa_warm, full_warm), ascii_row = row["unicode"], row["ascii"]
        print(f"compile {name}: {states} DFA states; DFA {dfa_first * 1e3:.0f} ms first, {dfa_warm * 1e3:.0f} ms "
              f"warm; whole constraint {full_first * 1e3:.0f} ms first, {full_warm * 1e3:.0f} ms warm "
              f"({full_warm:.2f}x of the 1 s budget; {full_warm / ascii_row[4]:.1f}x the ASCII-field template's "
              f"{ascii_row[4] * 1e3:.0f} ms, {ascii_row[0]} states)")


def full_index_times(engine: Engine) -> dict[str, tuple[int, float]]:
    """(states, seconds) to build every state's mask eagerly, for reference: decoding builds only
    the masks of the states it visits."""
    vocab = TokenVocab.from_tokenizer(engine.tokenizer, engine.vocab_size)
    out = {}
    for name, schema in (("unbounded strings", COMPACT_SCHEMA), ("bounded strings", SCHEMA)):
        constraint = ConstraintCompiler(lambda: vocab).compile("json_schema", schema)
        t = time.perf_counter()
        for state in range(constraint.dfa.num_states):
            constraint.index.mask(state)
        out[name] = (constraint.dfa.num_states, time.perf_counter() - t)
    return out


def prompts(engine: Engine, n: int) -> list[str]:
    return [engine.tokenizer.apply_chat_template([{"role": "user", "content":
            "Extract name, age, occupation, city, country and whether employed as JSON.\n" + TEXTS[i % len(TEXTS)]}])
            for i in range(n)]


def run(engine: Engine, batch: list[str], params: dict, jump: bool) -> tuple[float, list, dict]:
    engine.core.set_jump_forward(JumpForwarder(engine.tokenizer) if jump else None)
    engine.flush_cache()
    before = engine.stats()
    t = time.perf_counter()
    outs = engine.generate(batch, params)
    elapsed = time.perf_counter() - t
    after = engine.stats()
    keys = ("jump_forward_tokens_total", "jump_forward_drafted_total", "generated_tokens_total")
    return elapsed, outs, {k: after[k] - before[k] for k in keys}


STEP_REGEX = r"[a-zA-Z0-9 ,.'-]*"  # never complete: every request decodes max_new_tokens tokens
STEP_JSON_REGEX = r'\{"items":\["[a-zA-Z ]{0,12}"(,"[a-zA-Z ]{0,12}")*'  # an open list of short strings


class StepMaskTimer:
    """Times, inside the decode steps, what constraints add: each request's mask row (`Matcher.mask_words`)
    and the step's one bitmask applied to the logits (`sampler.apply_bitmask`)."""

    def __init__(self) -> None:
        self.seconds = 0.0
        self._orig = (Matcher.mask_words, sampler.apply_bitmask)

    def __enter__(self) -> "StepMaskTimer":
        def timed(orig):  # noqa: ANN001, ANN202
            def call(*args):  # noqa: ANN002, ANN202
                t = time.perf_counter()
                out = orig(*args)
                self.seconds += time.perf_counter() - t
                return out
            return call

        Matcher.mask_words, sampler.apply_bitmask = (timed(f) for f in self._orig)  # type: ignore[method-assign]
        return self

    def __exit__(self, *exc: object) -> None:
        Matcher.mask_words, sampler.apply_bitmask = self._orig  # type: ignore[method-assign]


def batch_step_overhead(engine: Engine, n: int, steps: int = 24, rounds: int = 3) -> None:
    """Prints the mean decode step of `n` requests with and without a constraint (the same prompts and
    step count), the share the constraint adds, and the part of it timed inside the step (the masks'
    rows and the one bitmask applied per step: a loaded machine's noise does not reach it)."""
    batch = prompts(engine, n)
    base = {"max_new_tokens": steps, "temperature": 0, "ignore_eos": True}
    kinds = {"unconstrained": base, "regex": {**base, "regex": STEP_REGEX},
             "JSON-like regex": {**base, "regex": STEP_JSON_REGEX}}
    best = {name: float("inf") for name in kinds}
    inside = {name: float("inf") for name in kinds}
    engine.generate(batch, {**kinds["regex"], "max_new_tokens": 2})  # warm the model and the masks' vocabulary
    for _ in range(rounds):
        for name, params in kinds.items():
            with StepMaskTimer() as timer:
                elapsed, outs, _ = run(engine, batch, params, jump=False)
            assert all(len(c.output_ids) == steps for c in outs), "every request decodes the same steps"
            best[name] = min(best[name], elapsed / steps)
            inside[name] = min(inside[name], timer.seconds / steps)
    plain = best["unconstrained"]
    print(f"decode step, batch {n}, {steps} steps (prefill included, best of {rounds}): unconstrained "
          f"{plain * 1e3:.1f} ms" + "".join(
              f"; {name} {t * 1e3:.1f} ms ({(t - plain) / plain:+.1%}; masks and bitmask inside the step "
              f"{inside[name] * 1e3:.1f} ms = {inside[name] / plain:.1%})" for name, t in best.items() if name != "unconstrained"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-running", type=int, default=4)
    ap.add_argument("--batch", type=int, default=64, help="constrained requests in the decode-step measurement")
    ap.add_argument("--only-batch", action="store_true", help="run only the decode-step measurement")
    args = ap.parse_args()
    if not args.only_batch:
        extraction(args)
    engine = Engine(device=args.device, kv_cache_tokens=32768, max_running_requests=args.batch)
    batch_step_overhead(engine, args.batch)
    engine.check_invariants()
    engine.shutdown()


def extraction(args: argparse.Namespace) -> None:
    """Compile and mask times, and the JSON extraction workload with and without jump-forward."""
    engine = Engine(device=args.device, kv_cache_tokens=32768, max_running_requests=args.max_running)
    print(f"model {engine.model_name} on {engine.device}, vocabulary {engine.vocab_size}")
    template_times(engine)
    for name, seconds in compile_times(engine).items():
        print(f"compile {name}: {seconds * 1e3:.0f} ms ({seconds:.2f}x of the 1 s budget)")
    for name, (states, seconds) in full_index_times(engine).items():
        print(f"  all {states} DFA states' masks, JSON-object regex with {name}, built eagerly: {seconds * 1e3:.0f} ms")

    batch = prompts(engine, args.prompts)
    params = {"json_schema": SCHEMA, "max_new_tokens": 120, "temperature": 0}
    engine.generate(batch[:1], {"max_new_tokens": 1})  # warm the model up, outside the timings
    engine.constraints.compile("json_schema", {"type": "integer"})  # and the vocabulary tables
    with MaskTimer() as cold:  # a fresh compile: first visits build their masks
        t_plain, outs_plain, s_plain = run(engine, batch, params, jump=False)
    with MaskTimer() as warm:
        t_jf, outs_jf, s_jf = run(engine, batch, params, jump=True)
    t_plain2, _, _ = run(engine, batch, params, jump=False)  # a second pair evens out noise
    t_jf2, _, _ = run(engine, batch, params, jump=True)
    print(cold.report("mask time, JSON schema, cold (first compile, decoding without jump-forward)"))
    print(warm.report("mask time, JSON schema, warm (decoding with jump-forward)"))
    g_batch = batch[: max(2, args.prompts // 3)]
    with MaskTimer() as grammar_cold:
        engine.generate(g_batch, {"grammar": JSON_GRAMMAR, "max_new_tokens": 80, "temperature": 0})
    with MaskTimer() as grammar_warm:
        engine.generate(g_batch, {"grammar": JSON_GRAMMAR, "max_new_tokens": 80, "temperature": 0})
    print(grammar_cold.report("mask time, Lark JSON grammar, cold"))
    print(grammar_warm.report("mask time, Lark JSON grammar, warm"))

    def valid(c) -> bool:  # noqa: ANN001
        try:
            jsonschema.validate(json.loads(c.text), SCHEMA)
            return c.meta.finish_reason == "stop"
        except (json.JSONDecodeError, jsonschema.ValidationError):
            return False

    tokens_jf = sum(len(c.output_ids) for c in outs_jf)
    same = sum(a.text == b.text for a, b in zip(outs_jf, outs_plain))
    jumped, drafted = s_jf["jump_forward_tokens_total"], s_jf["jump_forward_drafted_total"]
    print(f"jump-forwarded tokens: {jumped} of {tokens_jf} output tokens ({jumped / tokens_jf:.1%}); "
          f"{drafted} drafted, {jumped / max(drafted, 1):.0%} confirmed by the model; "
          f"decode steps {s_jf['generated_tokens_total']} vs {s_plain['generated_tokens_total']} without")
    best_jf, best_plain = min(t_jf, t_jf2), min(t_plain, t_plain2)
    print(f"JSON extraction, {len(batch)} prompts: jump-forward {best_jf:.2f} s vs without {best_plain:.2f} s "
          f"-> speed-up {best_plain / best_jf:.2f}x")
    print(f"greedy outputs identical with and without jump-forward: {same}/{len(batch)} ({same / len(batch):.0%}); "
          f"valid: {sum(map(valid, outs_jf))}/{len(batch)} with, {sum(map(valid, outs_plain))}/{len(batch)} without")
    for a, b in zip(outs_jf, outs_plain):
        if a.text != b.text:
            print(f"  differs:\n    jf:    {a.text}\n    plain: {b.text}")
    engine.check_invariants()
    engine.shutdown()


if __name__ == "__main__":
    main()
