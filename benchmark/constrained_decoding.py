"""Constrained decoding benchmark: compile time, per-token mask time, jump-forward share and speed-up.

Runs on the real SmolLM2-135M (CPU by default). Everything compared is measured in this run:
- compile time of a JSON-object regex over the 49k vocabulary (DFA + token index), budget 1 s;
- per-token mask time (p50 / p99) while decoding: JSON schema (regex path) and a Lark JSON grammar;
- share of output tokens that jump-forward appended instead of decoding;
- end-to-end time of a JSON extraction workload with jump-forward vs the same constraint without it,
  the greedy-output agreement between the two, and the share of outputs that validate.

    .venv/bin/python benchmark/constrained_decoding.py [--prompts 12] [--device cpu]
"""
from __future__ import annotations

import argparse
import json
import statistics
import time

import jsonschema
import numpy as np

from radixlang.runtime.constrained import matcher as matcher_module
from radixlang.runtime.constrained.compiler import ConstraintCompiler
from radixlang.runtime.constrained.jump_forward import JumpForwarder
from radixlang.runtime.constrained.vocab import TokenVocab
from radixlang.runtime.engine import Engine

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
JSON_GRAMMAR = r"""
start: value
?value: dict | list | ESCAPED_STRING | SIGNED_NUMBER | "true" | "false" | "null"
list : "[" [value ("," value)*] "]"
dict : "{" [pair ("," pair)*] "}"
pair : ESCAPED_STRING ":" value
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""
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
    """Wraps Matcher.mask to record how long each call takes."""

    def __init__(self) -> None:
        self.samples: list[float] = []
        self._orig = matcher_module.Matcher.mask

    def __enter__(self) -> "MaskTimer":
        orig, samples = self._orig, self.samples

        def timed(matcher):  # noqa: ANN001, ANN202
            t = time.perf_counter()
            out = orig(matcher)
            samples.append(time.perf_counter() - t)
            return out

        matcher_module.Matcher.mask = timed
        return self

    def __exit__(self, *exc: object) -> None:
        matcher_module.Matcher.mask = self._orig

    def report(self, name: str) -> str:
        ms = np.array(self.samples) * 1e3
        return f"{name}: {len(ms)} masks, p50 {np.percentile(ms, 50):.3f} ms, p99 {np.percentile(ms, 99):.3f} ms"


def compile_times(engine: Engine, repeats: int = 3) -> tuple[float, float]:
    """Median cold compile time (fresh compiler, vocabulary prepared) of the schema's JSON regex."""
    vocab = TokenVocab.from_tokenizer(engine.tokenizer, engine.vocab_size)
    regex_times, grammar_times = [], []
    for _ in range(repeats):
        compiler = ConstraintCompiler(lambda: vocab)
        t = time.perf_counter()
        compiler.compile("json_schema", SCHEMA)
        regex_times.append(time.perf_counter() - t)
        t = time.perf_counter()
        compiler.compile("grammar", JSON_GRAMMAR)
        grammar_times.append(time.perf_counter() - t)
    return statistics.median(regex_times), statistics.median(grammar_times)


def prompts(engine: Engine, n: int) -> list[str]:
    return [engine.tokenizer.apply_chat_template([{"role": "user", "content":
            "Extract name, age, occupation, city, country and whether employed as JSON.\n" + TEXTS[i % len(TEXTS)]}])
            for i in range(n)]


def run(engine: Engine, batch: list[str], params: dict, jump: bool) -> tuple[float, list, dict]:
    engine.scheduler.jump = JumpForwarder(engine.tokenizer) if jump else None
    engine.flush_cache()
    before = engine.stats()
    t = time.perf_counter()
    outs = engine.generate(batch, params)
    elapsed = time.perf_counter() - t
    after = engine.stats()
    return elapsed, outs, {k: after[k] - before[k] for k in ("jump_forward_tokens_total", "generated_tokens_total")}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompts", type=int, default=12)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--max-running", type=int, default=4)
    args = ap.parse_args()
    engine = Engine(device=args.device, kv_cache_tokens=32768, max_running_requests=args.max_running)
    print(f"model {engine.model_name} on {engine.device}, vocabulary {engine.vocab_size}")

    regex_s, grammar_s = compile_times(engine)
    print(f"compile, JSON-object regex (DFA + 49k-token index): {regex_s * 1e3:.0f} ms "
          f"({regex_s / 1.0:.2f}x of the 1 s budget); Lark JSON grammar (LALR + lexers): {grammar_s * 1e3:.0f} ms")

    batch = prompts(engine, args.prompts)
    params = {"json_schema": SCHEMA, "max_new_tokens": 120, "temperature": 0}
    engine.generate(batch[:1], params)  # compile once, outside the timings
    with MaskTimer() as jf_masks:
        t_jf, outs_jf, s_jf = run(engine, batch, params, jump=True)
    with MaskTimer() as plain_masks:
        t_plain, outs_plain, s_plain = run(engine, batch, params, jump=False)
    t_jf2, _, _ = run(engine, batch, params, jump=True)  # a second pair evens out warm-up and noise
    t_plain2, _, _ = run(engine, batch, params, jump=False)

    def valid(c) -> bool:  # noqa: ANN001
        try:
            jsonschema.validate(json.loads(c.text), SCHEMA)
            return c.meta.finish_reason == "stop"
        except (json.JSONDecodeError, jsonschema.ValidationError):
            return False

    tokens_jf = sum(len(c.output_ids) for c in outs_jf)
    same = sum(a.text == b.text for a, b in zip(outs_jf, outs_plain))
    print(plain_masks.report("mask time, JSON schema (regex path), no jump-forward"))
    print(jf_masks.report("mask time, JSON schema (regex path), jump-forward"))
    with MaskTimer() as grammar_masks:
        engine.scheduler.jump = JumpForwarder(engine.tokenizer)
        engine.generate(batch[: max(2, args.prompts // 3)], {"grammar": JSON_GRAMMAR, "max_new_tokens": 80,
                                                             "temperature": 0})
    print(grammar_masks.report("mask time, Lark JSON grammar"))
    print(f"jump-forwarded tokens: {s_jf['jump_forward_tokens_total']} of {tokens_jf} output tokens "
          f"({s_jf['jump_forward_tokens_total'] / tokens_jf:.1%}); decode steps sampled "
          f"{s_jf['generated_tokens_total']} vs {s_plain['generated_tokens_total']} without jump-forward")
    print(f"JSON extraction, {len(batch)} prompts: jump-forward {min(t_jf, t_jf2):.2f} s vs without "
          f"{min(t_plain, t_plain2):.2f} s -> speed-up {min(t_plain, t_plain2) / min(t_jf, t_jf2):.2f}x")
    print(f"greedy outputs identical with and without jump-forward: {same}/{len(batch)} ({same / len(batch):.0%}); "
          f"valid: {sum(map(valid, outs_jf))}/{len(batch)} with, {sum(map(valid, outs_plain))}/{len(batch)} without")
    for a, b in zip(outs_jf, outs_plain):
        if a.text != b.text:
            print(f"  differs:\n    jf:    {a.text}\n    plain: {b.text}")
    engine.check_invariants()
    engine.shutdown()


if __name__ == "__main__":
    main()
