"""JSONSchemaBench: JSON-schema coverage, compile time and correctness on real-world schemas.

Reads the public benchmark's `maskbench/data/` folder (github.com/guidance-ai/jsonschemabench) from a
local path; nothing is downloaded. Each file holds a schema and test instances marked valid or not.
Per subset (the file-name prefix before `---`) it reports:
- the share of schemas that compile within the time limit;
- p50 / p90 / p99 of compile + first mask (the 49,152-token SmolLM2 vocabulary, compact JSON, one thread),
  and the slowest schemas with their times (`--slowest N`); radixlang's compile includes, as the engine's does,
  the masks it computes at compile within `--precompute-ms` (the engine's constraint_precompute_ms, 100 ms by
  default; 0: none), as xgrammar's includes the masks it precomputes;
- false rejects (valid instances the constraint refuses) and false accepts (invalid instances it
  accepts), over the compiled schemas, with instances written as compact JSON in their own key order;
- the first error of each refused schema, bucketed by message, over all subsets; the schemas compiled
  with something left unenforced (a `--relax` keyword, declared order kept for a large object, the strict
  form where the schema's own semantics did not compile), bucketed, and how many false accepts they
  account for; with --failures, each such schema, where each false reject stops reading, and each false
  accept's instance;
- the per-token mask time (`Matcher.mask_words`, mean / p50 / p99) while feeding the tokenizer's tokens of a
  valid instance, as a decode would, three ways:
  - **fresh** (the issue's measure, and the table's): per compiled schema, its first valid instance of at most
    `--fresh-tokens` (48) tokens, right after compile + first mask, before anything else reads the schema: every
    lexer, lazily built table and walk it needs is built inside the timed masks;
  - after check: each accepted valid instance, timed after `accepts` has read it (its lexers and tables are built,
    its masks are not);
  - warm: the same again (masks cached).

Where xgrammar and llguidance are installed (the `grammar` extra: `pip install --no-deps xgrammar
apache-tvm-ffi llguidance`), each runs the same schemas through the same code, as `--grammar-backend`
runs them (runtime/constrained/backends.py: same vocabulary, compact JSON, one thread, cold compiles):
every column above, side by side, so the comparison table comes from one run. outlines-core, where
installed, is timed on compile + first mask only. A missing peer prints a skip.

    .venv/bin/python benchmark/jsonschemabench.py /path/to/maskbench/data [--per-subset 100] [--limit-s 10]
        [--relax uniqueItems] [--strict] [--no-peers] [--compile-only] [--slowest 10]

`--compile-only` times compile + first mask alone (no test instances, no per-token masks): the quick
loop for compile-time work.

What the process holds once loaded is frozen for Python's cyclic collector, as `radixlang serve` freezes the
loaded engine (`--no-freeze`: not; a full collection then walks torch's objects inside timed compiles and
masks: 480 against 195 us fresh mean on 2026-12-06).

By default schemas compile with their own semantics (properties in any order, undeclared ones where
`additionalProperties` allows them), as the engine does; `--strict` compiles OpenAI's strict form
(declared order, closed objects) instead, and runs xgrammar in its strict mode to match.
"""
from __future__ import annotations

import argparse
import gc
import json
import random
import re
import signal
import statistics
import time
from collections import Counter, defaultdict
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Callable

from radixlang.runtime.config import CONSTRAINT_PRECOMPUTE_MS
from radixlang.runtime.constrained.backends import LlguidanceCompiler, PeerCompiler, XgrammarCompiler
from radixlang.runtime.constrained.compiler import ConstraintCompiler, unenforced
from radixlang.runtime.constrained.masks.vocab import TokenVocab
from radixlang.runtime.constrained.matcher import Constraint, Matcher
from radixlang.runtime.constrained.regex.fsa import ConstraintTooLarge
from radixlang.runtime.constrained.unique_items import vocab_classes
from radixlang.runtime.models.loading.loader import default_model_path, gguf_metadata
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
    too_large: int = 0  # ... of which a lexer built mid-decode was over its size bound (ConstraintTooLarge)
    mask_fresh_us: list[float] = field(default_factory=list)  # per-token mask times, first instance, nothing built
    mask_us: list[float] = field(default_factory=list)  # per-token mask times, first walk of each instance
    mask_warm_us: list[float] = field(default_factory=list)  # the same walk again (masks cached)
    relaxed: int = 0  # compiled schemas that leave a --relax keyword unenforced (reported, as meta_info does)
    relaxed_false_accepts: int = 0  # ... and the invalid instances they accept (counted in false_accepts too)


class CompileTimeout(Exception):
    pass


def _on_alarm(signum, frame):
    raise CompileTimeout()


def load_vocab() -> tuple[Tokenizer, TokenVocab]:

    tokenizer = Tokenizer.from_gguf_metadata(gguf_metadata(default_model_path()))
    vocab = TokenVocab.from_tokenizer(tokenizer, tokenizer.vocab_size)
    vocab.trie  # built once per vocabulary, as an engine does at its first constraint: not a schema's cost
    vocab.native_trie  # likewise (the compiler builds it outside a compile's deadline)
    vocab_classes(vocab)  # likewise, the uniqueItems scan's token classes
    return tokenizer, vocab


def freeze_loaded() -> None:
    """What the process holds once loaded is frozen for the cyclic collector, as `radixlang serve` does after
    the engine loads (server/cli.py): else its full passes walk torch's objects and the vocabulary (~70 ms
    each) inside timed compiles and masks."""
    gc.collect()
    gc.freeze()


def sample_files(data: Path, per_subset: int, seed: int) -> dict[str, list[Path]]:
    by_subset: dict[str, list[Path]] = defaultdict(list)
    for path in sorted(data.glob("*.json")):
        subset = path.name.split("---")[0]
        if subset in SUBSETS:
            by_subset[subset].append(path)
    rng = random.Random(seed)
    return {s: sorted(rng.sample(files, min(per_subset, len(files)))) for s, files in by_subset.items()}


Compile = Callable[[dict], Constraint]  # a schema -> its constraint, cold (no cache hit)


def make_engines(tokenizer: Tokenizer, vocab: TokenVocab, relaxed: tuple[str, ...],
                 peers: bool, kind: str = "json_schema",
                 precompute_ms: float = CONSTRAINT_PRECOMPUTE_MS) -> dict[str, Compile]:
    """radixlang, then each installed grammar_backend peer, on the same vocabulary; a missing one is skipped.
    `kind`: json_schema (the schema's own semantics) or json_schema_strict (OpenAI's strict form).
    `precompute_ms`: radixlang's masks computed at compile (the engine's constraint_precompute_ms)."""
    def ours(schema: dict) -> Constraint:  # a fresh compiler: every schema compiles from scratch
        return ConstraintCompiler(lambda: vocab, json_relaxed=relaxed, precompute_ms=precompute_ms).compile(kind,
                                                                                                             schema)

    engines: dict[str, Compile] = {"radixlang": ours}
    makers: dict[str, Callable[[], PeerCompiler]] = {
        "xgrammar": lambda: XgrammarCompiler(vocab, None, threads=1),
        "llguidance": lambda: LlguidanceCompiler(vocab, None, lambda t: tokenizer.encode(t, add_special_tokens=False))}
    for name, make in makers.items() if peers else ():
        try:
            peer = make()  # its tokenizer tables: once per vocabulary, as an engine builds them, not a schema's cost
        except ImportError as e:
            print(f"skipping peer {name}: not installed ({e})")
            continue
        engines[name] = lambda schema, peer=peer: peer.compile(kind, schema, json.dumps(schema))
    return engines


def make_timed_peers(vocab: TokenVocab) -> dict[str, Callable[[dict], None]]:
    """Peers timed on compile + first mask only (no constraint interface of ours)."""
    peers: dict[str, Callable[[dict], None]] = {}
    try:
        import outlines_core as oc

        by_bytes: dict[bytes, list[int]] = defaultdict(list)
        for token in vocab.ids.tolist():
            by_bytes[vocab.bytes_of(token)].append(token)
        oc_vocab = oc.Vocabulary(vocab.end_ids[0], dict(by_bytes))

        def outlines_compile(schema: dict) -> None:
            regex = oc.json_schema.build_regex_from_schema(json.dumps(schema), whitespace_pattern="")
            index = oc.Index(regex, oc_vocab)
            index.get_allowed_tokens(index.get_initial_state())
        peers["outlines-core"] = outlines_compile
    except ImportError as e:
        print(f"skipping peer outlines-core: not installed ({e})")
    return peers


def run_peer(compile_one: Callable[[dict], None], schema: dict, limit_s: float, result: SubsetResult) -> None:
    """A peer's compile + first mask; its native code runs to completion, so the limit is checked after."""
    result.schemas += 1
    start = time.perf_counter()
    try:
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            compile_one(schema)
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except Exception:  # noqa: BLE001 - a peer's refusal, of whatever type, is a refusal
        return
    elapsed = time.perf_counter() - start
    if elapsed <= limit_s:
        result.compiled += 1
        result.times_ms.append(elapsed * 1e3)


def limited(run, limit_s: float, result: SubsetResult):
    """run() under the time limit; a check that fails (lexers are built on first use, and one may be
    too large or too slow) returns None and counts as a check error."""
    try:
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            return run()
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except (CompileTimeout, ValueError, TypeError) as e:  # numpy reports an alarm inside a comparison as a TypeError
        result.check_errors += 1
        result.too_large += isinstance(e, ConstraintTooLarge)
        return None


def accepts(constraint, text: str) -> bool:
    state = constraint.advance_bytes(constraint.initial(), text.encode())
    return state is not None and constraint.can_end(state)


def refused_at(constraint, text: str, limit_s: float, context: int = 40) -> str:
    """Where a refused instance stops: the text read, then the first byte refused (or "[end]"); or why
    the check failed (a lexer too large or too slow to build)."""
    data, state = text.encode(), constraint.initial()
    try:
        signal.setitimer(signal.ITIMER_REAL, limit_s)
        try:
            for i in range(len(data)):
                nxt = constraint.advance_bytes(state, data[i:i + 1])
                if nxt is None:
                    return (f"...{data[max(0, i - context):i].decode(errors='replace')}[refused]"
                            f"{data[i:i + 10].decode(errors='replace')}")
                state = nxt
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
    except (CompileTimeout, ValueError, TypeError) as e:
        return f"the check failed: {type(e).__name__}"
    return f"...{data[-context:].decode(errors='replace')}[end]"


def bucket(message: str) -> str:
    """An error message without its schema paths and values, so alike failures count together."""
    text = re.sub(r" at [#/]\S*", "", message)
    text = re.sub(r"'[^']*'|\"[^\"]*\"|\[[^\]]*\]|\d+", "_", text)
    return text[:110]


def time_masks(constraint, tokens: list[int], out: list[float]) -> bool:
    """Per-token `mask_words` times along `tokens` (an instance's), appended to `out`; False where the
    constraint refuses a token (the times up to it are kept)."""
    matcher = Matcher(constraint, constraint.vocab.end_ids)
    for token in tokens:
        start = time.perf_counter()
        matcher.mask_words(matcher.state)
        out.append((time.perf_counter() - start) * 1e6)
        if not matcher.advance(token):
            return False
    return True


def time_fresh_masks(constraint, tokenizer: Tokenizer, tests: list[dict], max_tokens: int, limit_s: float,
                     result: SubsetResult) -> None:
    """The issue's per-token mask measure on a just-compiled constraint: the first valid instance of at most
    `max_tokens` tokens that the constraint reads through, nothing of the schema built before it (a refused one
    is skipped, its times dropped: the next is then timed on what it built, as a decode after a refusal)."""
    for test in tests:
        if not test["valid"]:
            continue
        tokens = tokenizer.encode(compact(test["data"]), add_special_tokens=False)
        if len(tokens) > max_tokens:
            continue
        times: list[float] = []
        if limited(lambda: time_masks(constraint, tokens, times), limit_s, SubsetResult()):  # errors: counted by the check
            result.mask_fresh_us.extend(times)
            return


def compact(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def run_schema(tokenizer: Tokenizer, compile_one: Compile, path: Path, limit_s: float, result: SubsetResult,
               errors: Counter, failures: list[str] | None = None, reports: Counter | None = None,
               instances: bool = True, fresh_tokens: int = 48) -> None:
    """One schema through one engine: compile + first mask, then its test instances and mask times. A
    peer's native code runs to completion under the alarm: past the limit it counts as a timeout. `reports`
    gets what a compiled schema leaves unenforced."""
    try:
        case = json.loads(path.read_text())
    except ValueError:  # an empty or cut file (a partial copy of the data): not a schema to count
        if failures is not None:
            failures.append(f"{path.name}: not JSON, skipped")
        return
    result.schemas += 1
    start = time.perf_counter()
    try:
        try:
            signal.setitimer(signal.ITIMER_REAL, limit_s)
            constraint = compile_one(case["schema"])
            constraint.allowed(constraint.initial())
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)  # the alarm may still fire in here: caught below
        if time.perf_counter() - start > limit_s:
            raise CompileTimeout()
    except CompileTimeout:
        errors[f"timeout (> {limit_s:g} s)"] += 1
        if failures is not None:
            failures.append(f"{path.name}: timeout")
        return
    except (ValueError, RecursionError, RuntimeError) as e:  # RuntimeError: a peer library's own refusal
        errors[bucket(str(e))] += 1
        if failures is not None:
            failures.append(f"{path.name}: {e}")
        return
    result.times_ms.append((time.perf_counter() - start) * 1e3)
    result.compiled += 1
    report = unenforced(constraint)
    result.relaxed += bool(report)
    if reports is not None:
        reports.update({bucket(r.split(" (")[0]) for r in report})
    if report and failures is not None:
        failures.append(f"{path.name}: compiled, leaving unenforced: {', '.join(report)}")
    if instances:
        time_fresh_masks(constraint, tokenizer, case.get("tests", []), fresh_tokens, limit_s, result)
    for test in case.get("tests", []) if instances else ():
        text = compact(test["data"])
        ok = bool(limited(lambda: accepts(constraint, text), limit_s, result))
        if ok and test["valid"]:
            tokens = tokenizer.encode(text, add_special_tokens=False)
            for out in (result.mask_us, result.mask_warm_us):
                limited(lambda: time_masks(constraint, tokens, out), limit_s, result)
        if test["valid"]:
            result.valid += 1
            result.false_rejects += not ok
            if not ok and failures is not None:
                failures.append(f"{path.name}: false reject: {refused_at(constraint, text, limit_s)}")
        else:
            result.invalid += 1
            result.false_accepts += ok
            result.relaxed_false_accepts += ok and bool(report)
            if ok and failures is not None:
                failures.append(f"{path.name}: false accept{' (keywords reported unenforced)' if report else ''}: "
                                f"{text[:200]}")


def percentile(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100)[q - 1] if len(values) > 1 else (values[0] if values else float("nan"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("data", type=Path, help="the benchmark's maskbench/data folder, fetched beforehand")
    parser.add_argument("--per-subset", type=int, default=100, help="schemas sampled per subset")
    parser.add_argument("--limit-s", type=float, default=10.0, help="compile + first mask time limit per schema")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--errors", type=int, default=25, help="failure buckets to print")
    parser.add_argument("--no-peers", action="store_true", help="skip xgrammar / llguidance / outlines-core even if installed")
    parser.add_argument("--failures", action="store_true", help="list each refused schema with its first error, "
                        "and where each false reject stops")
    parser.add_argument("--subsets", nargs="*", default=list(SUBSETS), help="subsets to run (default: all)")
    parser.add_argument("--relax", nargs="*", default=["oneOf"], help="keywords left unenforced "
                        "where they cannot be enforced (the engine's default: oneOf; none: refused); false "
                        "accepts then count what they let through")
    parser.add_argument("--compile-only", action="store_true", help="time compile + first mask only (no test "
                        "instances, no per-token masks)")
    parser.add_argument("--no-freeze", action="store_true", help="leave what the process holds once loaded to "
                        "the cyclic collector (`radixlang serve` freezes it)")
    parser.add_argument("--fresh-tokens", type=int, default=48, help="the fresh mask measure's instance: the "
                        "first valid one of at most this many tokens")
    parser.add_argument("--slowest", type=int, default=10, help="slowest schemas to list per engine (compile + "
                        "first mask)")
    parser.add_argument("--strict", action="store_true", help="OpenAI's strict form (declared order, closed "
                        "objects) instead of the schema's own semantics; xgrammar in strict mode too")
    parser.add_argument("--precompute-ms", type=float, default=CONSTRAINT_PRECOMPUTE_MS, help="radixlang's "
                        "masks computed at compile, as the engine's constraint_precompute_ms (0: none)")
    args = parser.parse_args()
    if not args.data.is_dir():
        raise SystemExit(f"{args.data} is not a folder: pass the benchmark's maskbench/data folder")
    tokenizer, vocab = load_vocab()
    if not args.no_freeze:
        freeze_loaded()
    signal.signal(signal.SIGALRM, _on_alarm)
    engines = make_engines(tokenizer, vocab, tuple(args.relax), not args.no_peers,
                           "json_schema_strict" if args.strict else "json_schema", args.precompute_ms)
    reports: Counter = Counter()
    timed = {} if args.no_peers else make_timed_peers(vocab)
    totals = {name: SubsetResult() for name in (*engines, *timed)}
    errors: dict[str, Counter] = {name: Counter() for name in engines}
    failures: list[str] = []
    schema_ms: dict[str, dict[Path, float]] = {name: {} for name in totals}  # compiled schemas, per engine
    for subset, files in sample_files(args.data, args.per_subset, args.seed).items():
        if subset not in args.subsets:
            continue
        per = {name: SubsetResult() for name in totals}
        for path in files:  # each schema through every engine in turn: the same window for all of them
            for name, compile_one in engines.items():
                before = len(per[name].times_ms)
                ours = name == "radixlang"
                run_schema(tokenizer, compile_one, path, args.limit_s, per[name], errors[name],
                           failures if ours else None, reports if ours else None, not args.compile_only,
                           args.fresh_tokens)
                if len(per[name].times_ms) > before:
                    schema_ms[name][path] = per[name].times_ms[-1]
            for name, compile_only in timed.items():
                before = len(per[name].times_ms)
                run_peer(compile_only, json.loads(path.read_text())["schema"], args.limit_s, per[name])
                if len(per[name].times_ms) > before:
                    schema_ms[name][path] = per[name].times_ms[-1]
        for i, (name, r) in enumerate(per.items()):
            print_row(subset if i == 0 else f"  {name}", r, flush=True, peer=name in timed)
            merge(totals[name], r)
    for i, (name, r) in enumerate(totals.items()):
        print_row("all" if i == 0 else f"  {name}", r, peer=name in timed)
    common = set.intersection(*(set(t) for t in schema_ms.values()))
    if len(schema_ms) > 1 and common:
        shared = {name: [t[p] for p in common] for name, t in schema_ms.items()}
        print(f"compile + first mask on the {len(common)} schemas every system compiled: " + ", ".join(
            f"{name} p50 {percentile(v, 50):.1f} / p90 {percentile(v, 90):.1f} / p99 {percentile(v, 99):.1f} ms"
            for name, v in shared.items()))
    for name, times_of in schema_ms.items():
        slow = sorted(times_of.items(), key=lambda item: -item[1])[:args.slowest]
        print(f"{name}: slowest compile + first mask: " + ", ".join(f"{p.name} {t:.0f} ms" for p, t in slow))
    for name in engines:
        for kind, times in (("fresh (first instance, nothing built)", totals[name].mask_fresh_us),
                            ("after check", totals[name].mask_us), ("warm", totals[name].mask_warm_us)) \
                if not args.compile_only else ():
            print(f"{name} per-token mask (mask_words), {kind}: {len(times)} masks, mean "
                  f"{statistics.fmean(times or [0]):.1f} us, p50 {percentile(times, 50):.1f} us, "
                  f"p99 {percentile(times, 99):.1f} us")
    print_table({name: totals[name] for name in engines})
    for name, counter in errors.items():
        print(f"\n{name}: why schemas were refused (first error each, {sum(counter.values())} schemas):")
        for message, count in counter.most_common(args.errors if name == "radixlang" else 5):
            print(f"{count:5d}  {message}")
    total = totals["radixlang"]
    print(f"\nradixlang: left unenforced in compiled schemas (schemas each, {total.relaxed} schemas, "
          f"{total.relaxed_false_accepts} false accepts among them):")
    for message, count in reports.most_common(args.errors):
        print(f"{count:5d}  {message}")
    if args.failures:
        print("\nrefused schemas, those compiled with a keyword left unenforced, and false rejects:")
        print("\n".join(failures))


def print_table(totals: dict[str, SubsetResult]) -> None:
    """The comparison as one markdown table (the engines of this run, same schemas, same window)."""
    print("\n| engine | compiled | false accepts | false rejects | compile + first mask p50 / p90 / p99 | "
          "mask per token, mean: fresh / after check / warm |\n|---|---|---|---|---|---|")
    for name, r in totals.items():
        print(f"| {name} | {100 * r.compiled / max(r.schemas, 1):.1f}% | {r.false_accepts}/{r.invalid} | "
              f"{r.false_rejects}/{r.valid} ({100 * r.false_rejects / max(r.valid, 1):.1f}%) | "
              f"{percentile(r.times_ms, 50):.1f} / {percentile(r.times_ms, 90):.1f} / "
              f"{percentile(r.times_ms, 99):.1f} ms | "
              + (" / ".join(f"{statistics.fmean(t):.1f}" if t else "-"
                            for t in (r.mask_fresh_us, r.mask_us, r.mask_warm_us)) + " us |"))


def merge(total: SubsetResult, r: SubsetResult) -> None:
    for f in fields(SubsetResult):
        setattr(total, f.name, getattr(total, f.name) + getattr(r, f.name))


def print_row(name: str, r: SubsetResult, flush: bool = False, peer: bool = False) -> None:
    rate = 100 * r.compiled / max(r.schemas, 1)
    head = (f"{name:16s} compiled {r.compiled:4d}/{r.schemas:<4d} ({rate:5.1f}%)  "
            f"p50 {percentile(r.times_ms, 50):8.1f} ms  p90 {percentile(r.times_ms, 90):8.1f} ms  "
            f"p99 {percentile(r.times_ms, 99):8.1f} ms")
    if peer:
        print(head, flush=flush)
        return
    print(head + "  "
          f"false rejects {r.false_rejects}/{r.valid}  false accepts {r.false_accepts}/{r.invalid}"
          + (f"  relaxed {r.relaxed} schemas ({r.relaxed_false_accepts} of the false accepts)" if r.relaxed else "")
          + (f"  check errors {r.check_errors} ({r.too_large} lexers too large)" if r.check_errors else ""),
          flush=flush)


if __name__ == "__main__":
    main()
