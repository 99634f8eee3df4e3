"""JSONSchemaBench: JSON-schema coverage, compile time and correctness on real-world schemas.

Reads the public benchmark's `maskbench/data/` folder (github.com/guidance-ai/jsonschemabench) from a
local path; nothing is downloaded. Each file holds a schema and test instances marked valid or not.
Per subset (the file-name prefix before `---`) it reports:
- the share of schemas that compile within the time limit;
- p50 / p90 of compile + first mask (the 49,152-token SmolLM2 vocabulary, compact JSON, one thread);
- false rejects (valid instances the constraint refuses) and false accepts (invalid instances it
  accepts), over the compiled schemas, with instances written as compact JSON in their own key order;
- the first error of each refused schema, bucketed by message, over all subsets;
- the per-token mask time (`Matcher.mask_words`, p50 / p99) while feeding the tokenizer's tokens of
  each accepted valid instance, as a decode would: cold (first visits build masks) and warm (again).

    .venv/bin/python benchmark/jsonschemabench.py /path/to/maskbench/data [--per-subset 100] [--limit-s 10]
        [--relax uniqueItems]
"""
from __future__ import annotations

import argparse
import json
import random
import re
import signal
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path

from radixlang.runtime.constrained.compiler import ConstraintCompiler
from radixlang.runtime.constrained.matcher import Matcher
from radixlang.runtime.constrained.vocab import TokenVocab
from radixlang.runtime.models.loader import default_model_path, gguf_metadata
from radixlang.runtime.tokenizer import Tokenizer

SUBSETS = ("Github_trivial", "Github_easy", "Github_medium", "Github_hard", "Github_ultra", "Glaiveai2K",
           "JsonSchemaStore", "Kubernetes", "Snowplow", "WashingtonPost")


@dataclass(slots=True)
class SubsetResult:
    schemas: int = 0
    compiled: int = 0
    times_ms: list[float] = field(default_factory=list)
    valid: int = 0
    false_rejects: int = 0
    invalid: int = 0
    false_accepts: int = 0
    check_errors: int = 0  # instances whose check failed (a lexer too large or too slow to build): refused
    mask_us: list[float] = field(default_factory=list)  # per-token mask times, first walk of each instance
    mask_warm_us: list[float] = field(default_factory=list)  # the same walk again (masks cached)


class CompileTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise CompileTimeout()


def load_vocab() -> tuple[Tokenizer, TokenVocab]:
    import gguf

    tokenizer = Tokenizer.from_gguf_metadata(gguf_metadata(gguf.GGUFReader(str(default_model_path()))))
    vocab = TokenVocab.from_tokenizer(tokenizer, tokenizer.vocab_size)
    vocab.trie  # built once per vocabulary, as an engine does at its first constraint: not a schema's cost
    return tokenizer, vocab


def sample_files(data: Path, per_subset: int, seed: int) -> dict[str, list[Path]]:
    by_subset: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(data.glob("*.json")):
        subset = path.name.split("---")[0]
        if subset in SUBSETS:
            by_subset[subset].append(path)
    rng = random.Random(seed)
    return {s: sorted(rng.sample(files, min(per_subset, len(files)))) for s, files in by_subset.items()}


def limited(run, limit_s: float, result: SubsetResult):
    """run() under the time limit; a check that fails (lexers are built on first use, and one may be
    too large or too slow) returns None and counts as a check error."""
    try:
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            return run()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except (CompileTimeout, ValueError):
        result.check_errors += 1
        return None


def accepts(constraint, text: str) -> bool:
    state = constraint.advance_bytes(constraint.initial(), text.encode())
    return state is not None and constraint.can_end(state)


def bucket(message: str) -> str:
    """An error message without its schema paths and values, so alike failures count together."""
    text = re.sub(r" at [#/]\S*", "", message)
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\[[^\]]*\]|\d+", "_", text)
    return text[:110]


def time_masks(constraint, tokenizer: Tokenizer, text: str, out: list[float]) -> None:
    """Per-token `mask_words` times along the tokenizer's tokens of `text` (an accepted instance)."""
    matcher = Matcher(constraint, constraint.vocab.end_ids)
    for token in tokenizer.encode(text, add_special_tokens=False):
        start = time.perf_counter()
        matcher.mask_words(matcher.state)
        out.append((time.perf_counter() - start) * 1e6)
        if not matcher.advance(token):
            return


def run_schema(tokenizer: Tokenizer, vocab: TokenVocab, path: Path, limit_s: float, result: SubsetResult, errors: Counter,
               relaxed: tuple[str, ...] = (), failures: list[str] | None = None) -> None:
    case = json.loads(path.read_text())
    result.schemas += 1
    compiler = ConstraintCompiler(lambda: vocab, json_relaxed=relaxed)  # fresh: every schema compiles from scratch
    start = time.perf_counter()
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, limit_s)
            constraint = compiler.compile("json_schema", case["schema"])
            constraint.allowed(constraint.initial())
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)  # the alarm may still fire in here: caught below
    except CompileTimeout:
        errors[f"timeout (> {limit_s:g} s)"] += 1
        if failures is not None:
            failures.append(f"{path.name}: timeout")
        return
    except (ValueError, RecursionError) as e:
        errors[bucket(str(e))] += 1
        if failures is not None:
            failures.append(f"{path.name}: {e}")
        return
    result.times_ms.append((time.perf_counter() - start) * 1e3)
    result.compiled += 1
    for test in case.get("tests", []):
        text = json.dumps(test["data"], ensure_ascii=False, separators=(",", ":"))
        ok = bool(limited(lambda: accepts(constraint, text), limit_s, result))
        if ok and test["valid"]:
            for out in (result.mask_us, result.mask_warm_us):
                limited(lambda: time_masks(constraint, tokenizer, text, out), limit_s, result)
        if test["valid"]:
            result.valid += 1
            result.false_rejects += not ok
        else:
            result.invalid += 1
            result.false_accepts += ok


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="the benchmark's maskbench/data folder, fetched beforehand")
    parser.add_argument("--per-subset", type=int, default=100, help="schemas sampled per subset")
    parser.add_argument("--limit-s", type=float, default=10.0, help="compile + first mask time limit per schema")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--errors", type=int, default=25, help="failure buckets to print")
    parser.add_argument("--failures", action="store_true", help="list each refused schema with its first error")
    parser.add_argument("--subsets", nargs="*", default=list(SUBSETS), help="subsets to run (default: all)")
    parser.add_argument("--relax", nargs="*", default=[], help="keywords left unenforced where they cannot be "
                        "enforced (uniqueItems); false accepts then count what they let through")
    args = parser.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"{args.data} is not a folder: pass the benchmark's maskbench/data folder")
    tokenizer, vocab = load_vocab()
    signal.signal(signal.SIGALRM, _on_alarm)
    results: dict[str, SubsetResult] = {}
    errors: Counter = Counter()
    failures: list[str] = []
    for subset, files in sample_files(args.data, args.per_subset, args.seed).items():
        if subset not in args.subsets:
            continue
        result = results[subset] = SubsetResult()
        for path in files:
            run_schema(tokenizer, vocab, path, args.limit_s, result, errors, tuple(args.relax), failures)
        print_row(subset, result, flush=True)
    total = SubsetResult()
    for r in results.values():
        total.schemas += r.schemas
        total.compiled += r.compiled
        total.times_ms += r.times_ms
        total.valid += r.valid
        total.false_rejects += r.false_rejects
        total.invalid += r.invalid
        total.false_accepts += r.false_accepts
        total.check_errors += r.check_errors
        total.mask_us += r.mask_us
        total.mask_warm_us += r.mask_warm_us
    print_row("all", total)
    for name, times in (("cold", total.mask_us), ("warm", total.mask_warm_us)):
        print(f"per-token mask (mask_words), {name}: {len(times)} masks, p50 {percentile(times, 50):.1f} us, "
              f"p99 {percentile(times, 99):.1f} us")
    print(f"\nwhy schemas were refused (first error each, {sum(errors.values())} schemas):")
    for message, count in errors.most_common(args.errors):
        print(f"{count:5d}  {message}")
    if args.failures:
        print("\nrefused schemas:")
        print("\n".join(failures))


def print_row(name: str, r: SubsetResult, flush: bool = False) -> None:
    rate = 100 * r.compiled / max(r.schemas, 1)
    print(f"{name:16s} compiled {r.compiled:4d}/{r.schemas:<4d} ({rate:5.1f}%)  "
          f"p50 {percentile(r.times_ms, 50):8.1f} ms  p90 {percentile(r.times_ms, 90):8.1f} ms  "
          f"false rejects {r.false_rejects}/{r.valid}  false accepts {r.false_accepts}/{r.invalid}"
          + (f"  check errors {r.check_errors}" if r.check_errors else ""), flush=flush)


if __name__ == "__main__":
    main()
