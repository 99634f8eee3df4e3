"""BFCL tool calling: valid calls and AST accuracy with the constraint vs. parse-after-the-fact.

Data: the Berkeley Function Calling Leaderboard's questions and possible answers, as the PyPI package
`bfcl-eval` ships them (`bfcl_eval/data/`). Install it without its (large, pinned) dependencies; only its
data files are read, nothing of it is imported:
    .venv/bin/pip install --no-deps bfcl-eval

Categories simple_python, multiple, parallel, parallel_multiple run through /v1/chat/completions (the
`openai` SDK against a server in this process) with `tools`, two ways on the same model:
- constrained: tool_choice "required" (a structural tag: every call a listed tool, arguments valid);
- unconstrained: the same prompt (tools rendered in the system turn the same way), tool_choice "none"
  (no constraint), the text parsed after the fact as leniently as SGLang's detectors do (the prompted
  <tool_call> form, bare JSON calls, Python calls; see parse_after_the_fact).
parallel_tool_calls is true only in the parallel categories (their premise), for both ways.
Reported per category and way: calls that parse and validate against their schema (jsonschema), AST
accuracy (BFCL's rules: right function names and count, every required argument, each value among the
possible answers, strings compared case- and punctuation-insensitively, ints accepted for floats,
parallel calls matched in any order), the share cut by max_tokens (and valid calls among the outputs it
did not cut), and output tokens/s. Then: constraint compile p50 / p90 for
requests with 10 tools (new tools, a new mix of known tools, a repeated request; see compile_times), and
decode speed with an "auto" structural tag vs. plain decoding on the same prompts (same run, alternated).

BFCL's schema dialect ("dict", "float", "tuple", "any") is converted here, not in the engine.

With a reasoning model (--model, its parser detected from its chat template or set with
--reasoning-parser) and --thinking-token-budget N, a third way runs: constrained after at most N thinking
tokens (docs/reasoning.md), beside the constrained way without thinking (Qwen3's enable_thinking false;
for other templates the model's own default). --open-thinking makes any model a thinking one: its own chat
template plus a generation prompt that opens `<think>` (closed empty, as Qwen3's is, under enable_thinking
false), so the default model thinks in free text until the budget closes the block.

    .venv/bin/python benchmark/tool_calls.py [--per-category 10] [--max-tokens 128] [--concurrency 8]
        [--model M --thinking-token-budget 64] [--open-thinking --thinking-token-budget 32]
        [--categories simple_python,multiple] [--question-ids multiple_9] [--calls-only]
"""
from __future__ import annotations

import argparse
import importlib.util
import json
import re
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

CATEGORIES = ("simple_python", "multiple", "parallel", "parallel_multiple")
_TYPES = {"dict": "object", "float": "number", "tuple": "array", "integer": "integer", "string": "string",
          "boolean": "boolean", "array": "array", "number": "number", "object": "object"}


def data_dir() -> Path:
    spec = importlib.util.find_spec("bfcl_eval")  # finds the package without running its __init__
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("bfcl-eval is not installed: .venv/bin/pip install --no-deps bfcl-eval")
    return Path(next(iter(spec.submodule_search_locations))) / "data"


def load(category: str, limit: int, ids: frozenset[str] = frozenset()) -> list[tuple[dict, list]]:
    """The category's first `limit` questions (`ids`: those questions only) and their possible answers."""
    root = data_dir()
    questions = [json.loads(line) for line in (root / f"BFCL_v4_{category}.json").read_text().splitlines()]
    questions = [q for q in questions if q["id"] in ids] if ids else questions[:limit]
    answers = {a["id"]: a["ground_truth"] for a in map(json.loads,
               (root / "possible_answer" / f"BFCL_v4_{category}.json").read_text().splitlines())}
    return [(q, answers[q["id"]]) for q in questions]


def json_schema(bfcl: Any) -> Any:
    """BFCL's parameter schema as JSON Schema."""
    if isinstance(bfcl, list):
        return [json_schema(x) for x in bfcl]
    if not isinstance(bfcl, dict):
        return bfcl
    out = {}
    for key, value in bfcl.items():
        if key == "type":
            if value != "any":
                out["type"] = _TYPES.get(value, value)
        elif key in ("properties",):
            out[key] = {k: json_schema(v) for k, v in value.items()}
        elif key in ("items", "additionalProperties"):
            out[key] = json_schema(value)
        elif key in ("required", "enum", "description", "default", "minimum", "maximum", "format"):
            out[key] = value
    if out.get("type") == "object" and "properties" not in out:
        out["properties"] = {}
    return out


def tools_of(question: dict) -> list[dict]:
    return [{"type": "function", "function": {"name": f["name"], "description": f.get("description", ""),
                                              "parameters": json_schema(f["parameters"])}}
            for f in question["function"]]


# ---- BFCL's AST check -----------------------------------------------------------------------------
def _standard(s: str) -> str:
    return re.sub(r"[ ,./\-_*^]", "", s).lower().replace("'", '"')


def _value_ok(value: Any, allowed: Any) -> bool:
    if isinstance(allowed, str) and isinstance(value, str):
        return _standard(value) == _standard(allowed)
    if isinstance(allowed, bool) or isinstance(value, bool):
        return value is allowed
    if isinstance(allowed, (int, float)) and isinstance(value, (int, float)):
        return float(value) == float(allowed)
    if isinstance(allowed, list) and isinstance(value, list):
        return len(value) == len(allowed) and all(_value_ok(v, a) for v, a in zip(value, allowed))
    if isinstance(allowed, dict) and isinstance(value, dict):
        return all(k in allowed and any(_value_ok(value[k], a) for a in allowed[k]) for k in value) and \
            all(k in value or "" in allowed[k] for k in allowed)
    return value == allowed


def call_ok(call: dict, truth: dict, functions: dict[str, dict]) -> bool:
    (name, params), = truth.items()
    if call["name"] != name:
        return False
    schema = functions[name]["parameters"]
    args = call["arguments"]
    if any(k not in schema.get("properties", {}) for k in args):
        return False
    if any(k not in args for k in schema.get("required", [])):
        return False
    for key, allowed in params.items():
        if key not in args:
            if "" not in allowed:
                return False
        elif not any(_value_ok(args[key], a) for a in allowed if a != ""):
            return False
    return True


def ast_ok(calls: list[dict], truths: list[dict], functions: dict[str, dict]) -> bool:
    """Every ground-truth call matched by exactly one call, in any order."""
    if len(calls) != len(truths):
        return False

    def match(i: int, used: frozenset[int]) -> bool:
        if i == len(calls):
            return True
        return any(j not in used and call_ok(calls[i], truths[j], functions) and match(i + 1, used | {j})
                   for j in range(len(truths)))
    return match(0, frozenset())


# ---- runs -----------------------------------------------------------------------------------------
def ask(client, question: dict, constrained: bool, max_tokens: int, parallel: bool, budget: int | None = None,
        no_think: bool = False) -> tuple[list[dict] | None, int, bool]:
    """The calls (None: the output did not parse), the completion tokens, and whether max_tokens cut it.
    `budget`: think first, at most that many tokens; `no_think`: ask the template not to think."""
    extra: dict[str, Any] = {}
    if budget is not None:
        extra["thinking_token_budget"] = budget
    if no_think:
        extra["chat_template_kwargs"] = {"enable_thinking": False}
    reply = client.chat.completions.create(model="default", messages=question["question"][0],
                                           tools=tools_of(question), tool_choice="required" if constrained else "none",
                                           parallel_tool_calls=parallel, max_tokens=max_tokens, temperature=0,
                                           extra_body=extra or None)
    message, tokens = reply.choices[0].message, reply.usage.completion_tokens
    cut = reply.choices[0].finish_reason == "length"
    if constrained:
        calls = [{"name": c.function.name, "arguments": json.loads(c.function.arguments)}
                 for c in message.tool_calls or []]
        return calls or None, tokens, cut
    return parse_after_the_fact(message.content or ""), tokens, cut


# ---- parse after the fact (the unconstrained way) -------------------------------------------------
def parse_after_the_fact(text: str) -> list[dict] | None:
    """The calls in unconstrained text, read as leniently as SGLang's detectors read them: the prompted
    `<tool_call>{...}</tool_call>` form (hermes / qwen25: an unclosed last tag too), else bare JSON
    objects with "name" and "arguments" / "parameters" (llama3 json, one or an array, `;`-separated),
    else Python calls `[f(a=1), g(b="x")]` or `f(a=1)` (pythonic). None: nothing parsed."""
    for read in (_hermes_calls, _json_calls, _pythonic_calls):
        calls = read(text)
        if calls:
            return calls
    return None


def _as_call(item: Any) -> dict | None:
    if not isinstance(item, dict) or not isinstance(item.get("name"), str):
        return None
    args = item.get("arguments", item.get("parameters", {}))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except json.JSONDecodeError:
            return None
    return {"name": item["name"], "arguments": args} if isinstance(args, dict) else None


def _hermes_calls(text: str) -> list[dict]:
    out = []
    for body in re.findall(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", text, re.DOTALL):
        try:
            call = _as_call(json.JSONDecoder().raw_decode(body)[0])
        except json.JSONDecodeError:
            continue
        if call:
            out.append(call)
    return out


def _json_calls(text: str) -> list[dict]:
    decoder, out, pos = json.JSONDecoder(), [], 0
    while (pos := _next_bracket(text, pos)) >= 0:
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError:
            pos += 1
            continue
        calls = [_as_call(v) for v in (value if isinstance(value, list) else [value])]
        out.extend(c for c in calls if c)
        pos = end
    return out


def _next_bracket(text: str, pos: int) -> int:
    found = [i for i in (text.find("{", pos), text.find("[", pos)) if i >= 0]
    return min(found) if found else -1


def _pythonic_calls(text: str) -> list[dict]:
    import ast

    for match in re.finditer(r"\[?\s*[A-Za-z_][\w.]*\(.*\)\s*\]?", text, re.DOTALL):
        source = match.group(0).strip()
        try:
            tree = ast.parse(source if source.startswith("[") else f"[{source}]", mode="eval").body
        except SyntaxError:
            continue
        if not isinstance(tree, ast.List) or not all(isinstance(c, ast.Call) for c in tree.elts):
            continue
        try:
            return [{"name": ast.unparse(c.func), "arguments": {k.arg: ast.literal_eval(k.value) for k in c.keywords}}
                    for c in tree.elts if not c.args]
        except ValueError:
            continue
    return []


def valid(calls: list[dict] | None, functions: dict[str, dict]) -> bool:
    import jsonschema

    if not calls:
        return False
    for c in calls:
        if c["name"] not in functions:
            return False
        try:
            jsonschema.validate(c["arguments"], functions[c["name"]]["parameters"])
        except jsonschema.ValidationError:
            return False
    return True


def run_category(client, category: str, limit: int, constrained: bool, max_tokens: int,
                 concurrency: int, budget: int | None = None, no_think: bool = False,
                 ids: frozenset[str] = frozenset()) -> dict[str, float]:
    items = load(category, limit, ids)
    parallel = category.startswith("parallel")  # the category's own premise, the same for both ways
    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda qa: ask(client, qa[0], constrained, max_tokens, parallel, budget, no_think),
                                items))
    elapsed = time.perf_counter() - started
    n_valid = n_ast = tokens = n_cut = n_valid_uncut = 0
    for (question, truth), (calls, used, cut) in zip(items, results):
        functions = {t["function"]["name"]: t["function"] for t in tools_of(question)}
        tokens += used
        n_cut += cut
        n_valid += valid(calls, functions)
        n_valid_uncut += not cut and valid(calls, functions)
        n_ast += bool(calls) and ast_ok(calls, truth, functions)
    uncut = len(items) - n_cut
    return {"valid": 100 * n_valid / len(items), "ast": 100 * n_ast / len(items), "tok_s": tokens / elapsed,
            "n": len(items), "cut": 100 * n_cut / len(items),
            "valid_uncut": 100 * n_valid_uncut / uncut if uncut else float("nan")}


def compile_times(engine, repeats: int = 15) -> dict[str, tuple[float, float, float]]:
    """(p50 ms, p90 ms, share on the general path %) to compile the "auto" structural tag of 10 BFCL tools
    plus its first mask, on the engine's compiler after one warm-up request (vocabulary tables built):
    - new tools: every tool in the request is new to the engine (the first request of an agent);
    - new mix: a new mix of tools the engine has compiled before (no request-level cache hit);
    - repeated: the same request again (the compiled-constraint cache)."""
    import random

    from radixlang.runtime.constrained.tag_dispatch import TagDispatch
    from radixlang.runtime.tool_formats import FALLBACK, tool_call_structural_tag

    pool = list({t["function"]["name"]: t["function"] for q, _ in load("multiple", 200) for t in tools_of(q)}.values())
    random.Random(0).shuffle(pool)
    compiler = engine.constraints
    rng = random.Random(1)
    seen = pool[:10 * repeats]
    runs: dict[str, list[list[dict]]] = {
        "warm-up": [pool[-10:]],
        "new tools": [pool[r * 10:(r + 1) * 10] for r in range(repeats)],
        "new mix": [rng.sample(seen, 10) for _ in range(repeats)],
    }
    runs["repeated"] = runs["new mix"]
    out = {}
    for way, requests in runs.items():
        times, general = [], 0
        for tools in requests:
            tag = tool_call_structural_tag(FALLBACK, tools, "auto")
            t = time.perf_counter()
            c = compiler.compile("structural_tag", tag)
            c.allowed_bits(c.initial())  # the first mask, as a request's first step needs it
            times.append(1000 * (time.perf_counter() - t))
            general += not isinstance(c, TagDispatch)
        times.sort()
        out[way] = (statistics.median(times), times[int(0.9 * (len(times) - 1))], 100 * general / len(times))
    del out["warm-up"]
    return out


def decode_ratio(engine, tokens: int = 64, rounds: int = 4) -> tuple[float, float]:
    """Median output tok/s with an "auto" structural tag (10 tools; the text stays free) and without, on
    the same prompts, the two ways alternated (which goes first swaps each round) so load drifts hit both."""
    from radixlang.runtime.tool_formats import FALLBACK, tool_call_structural_tag

    tools = [t["function"] for q, _ in load("multiple", 40) for t in tools_of(q)][:10]
    tag = tool_call_structural_tag(FALLBACK, tools, "auto")
    prompts = [f"Write a short story about a {w}." for w in ("cat", "ship", "tree", "robot")]
    speeds: dict[bool, list[float]] = {True: [], False: []}
    engine.generate(prompts, {"max_new_tokens": 4, "structural_tag": tag})  # compiled before timing
    for r in range(rounds):
        for tagged in ((False, True) if r % 2 == 0 else (True, False)):
            params = {"max_new_tokens": tokens, "ignore_eos": True, "temperature": 0}
            if tagged:
                params["structural_tag"] = tag
            t = time.perf_counter()
            outs = engine.generate(prompts, params)
            speeds[tagged].append(sum(o.meta.completion_tokens for o in outs) / (time.perf_counter() - t))
    return statistics.median(speeds[False]), statistics.median(speeds[True])


OPEN_THINKING = ("{% if add_generation_prompt %}{% if enable_thinking is defined and enable_thinking is false %}"
                 "<think>\n\n</think>\n\n{% else %}<think>\n{% endif %}{% endif %}")


def thinking_template(model: str | None) -> str:
    """A template file: the model's own, its generation prompt followed by an opened <think> block (Qwen3's
    empty block under enable_thinking false)."""
    import tempfile

    from radixlang.runtime.engine import Engine

    probe = Engine(model=model, kv_cache_tokens=256)
    try:
        own = probe.tokenizer.chat_template
    finally:
        probe.shutdown()
    if not own:
        raise SystemExit("--open-thinking needs a model with a chat template")
    path = Path(tempfile.mkdtemp()) / "thinking.jinja"
    path.write_text(own + OPEN_THINKING)
    return str(path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--per-category", type=int, default=10)
    ap.add_argument("--max-tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--reasoning-parser", default="auto")
    ap.add_argument("--thinking-token-budget", type=int, default=None,
                    help="also run the constrained way after at most this many thinking tokens")
    ap.add_argument("--categories", default=",".join(CATEGORIES), help="comma-separated BFCL categories")
    ap.add_argument("--question-ids", default="",
                    help="comma-separated BFCL ids (e.g. multiple_9): only those, in the categories they belong to")
    ap.add_argument("--calls-only", action="store_true",
                    help="only the calls: no compile timings, no decode ratio, no unconstrained way")
    ap.add_argument("--open-thinking", action="store_true",
                    help="the model's template with a generation prompt that opens a <think> block")
    args = ap.parse_args()
    import openai

    from radixlang.runtime.engine import Engine
    from radixlang.server.launch import background_server

    template = thinking_template(args.model) if args.open_thinking else None
    engine = Engine(model=args.model, device=args.device, kv_cache_tokens=65536,
                    reasoning_parser=args.reasoning_parser, chat_template=template)
    print(f"reasoning parser: {engine.reasoning_parser}", flush=True)
    budget = args.thinking_token_budget
    if budget is not None and engine.reasoning_parser is None:
        raise SystemExit("--thinking-token-budget needs a reasoning model (its parser detected or set)")
    # (constrained, budget): the think way beside the constrained one without thinking
    ways = [(True, None)] + ([] if args.calls_only else [(False, None)]) + ([(True, budget)] if budget is not None else [])
    categories = args.categories.split(",")
    ids = frozenset(filter(None, args.question_ids.split(",")))
    if ids:  # the categories the ids name (an id is the category, "_", a number)
        categories = [c for c in CATEGORIES if any(i.rsplit("_", 1)[0] == c for i in ids)]
    if unknown := set(categories) - set(CATEGORIES):
        raise SystemExit(f"unknown categories {sorted(unknown)}; known: {', '.join(CATEGORIES)}")
    try:
        if not args.calls_only:
            for way, (p50, p90, general) in compile_times(engine).items():
                print(f"structural tag compile, 10 tools, + first mask, {way:<9}: p50 {p50:.1f} ms, "
                      f"p90 {p90:.1f} ms ({general:.0f}% on the general path)", flush=True)
            plain, tagged = decode_ratio(engine)
            print(f"decode: plain {plain:.1f} tok/s, auto structural tag {tagged:.1f} tok/s "
                  f"(ratio {tagged / plain:.2f})")
        with background_server(engine) as server, openai.OpenAI(base_url=f"{server.url}/v1", api_key="-",
                                                                max_retries=0, timeout=600) as client:
            print(f"{'category':<18} {'way':<14} {'n':>3} {'valid %':>8} {'of uncut':>8} {'AST %':>7} {'cut %':>6} "
                  f"{'tok/s':>7}")
            ast: dict[tuple[bool, int | None], list[float]] = {w: [] for w in ways}
            for category in categories:
                for constrained, think in ways:
                    r = run_category(client, category, args.per_category, constrained, args.max_tokens,
                                     args.concurrency, think, no_think=budget is not None and think is None, ids=ids)
                    ast[(constrained, think)].append(r["ast"])
                    way = f"think {think}" if think is not None else "constrained" if constrained else "unconstrained"
                    print(f"{category:<18} {way:<14} {r['n']:>3} {r['valid']:>8.1f} {r['valid_uncut']:>8.1f} {r['ast']:>7.1f} "
                          f"{r['cut']:>6.1f} {r['tok_s']:>7.1f}", flush=True)
            ours = statistics.mean(ast[(True, None)])
            if not args.calls_only:
                theirs = statistics.mean(ast[(False, None)])
                ratio = f"{ours / theirs:.2f}x" if theirs else "unbounded (the unconstrained way scored 0)"
                print(f"AST accuracy over the categories: constrained {ours:.1f}%, unconstrained {theirs:.1f}%, "
                      f"ratio {ratio}")
            if budget is not None:
                print(f"AST accuracy with thinking (budget {budget}): {statistics.mean(ast[(True, budget)]):.1f}%, "
                      f"without: {ours:.1f}%")
    finally:
        engine.check_invariants()
        engine.shutdown()


if __name__ == "__main__":
    main()
