"""Agents under KV pressure: retention off (plain LRU) vs prompt_cache_key pins vs pins + the host KV tier,
all three measured in this run against the same model and the same scripted workload.

Workload (seeded, identical for every config):
  - N concurrent agents (default 16), each a multi-turn tool-using session of 8-12 turns: every turn is a
    request on the whole history so far; the agent then waits 0.2-2 s for a "tool", whose result (~120
    tokens) is appended; the history grows to a few thousand tokens;
  - half of the agents fork 2-3 sub-agents on their shared history halfway through (2 turns each);
  - background load: one-shot requests with unique prompts, 2 at a time, for as long as the agents run;
  - the KV pool holds about half of the agents' working set (their final histories).
Agents send prompt_cache_key (their id; a sub-agent its own) in the retention configs, nothing in "off".
"off" and "pins" run without the host KV tier, "pins+host" with it at its default size: the engine's
defaults, and what a client of them gets by sending prompt_cache_key.

Reports per config: prompt tokens recomputed per agent turn (prefilled again although cached before: the
engine's recomputed_cached_tokens_total), prompt tokens prefilled per turn, p50 / p95 / p99 time to first
token per agent turn, agent turns/s, background tokens/s (prompt + generated), and the ratios against "off".
The machine's cores may be shared with other work: compare ratios within one run, not absolute figures.

`--rounds N` repeats the three configs N times, round r on workload seed `--seed` + r in every config (the
configs interleaved, so a change of load hits all three alike), prints each round, then every config's
figures over all its turns pooled across rounds: one round has only ~35-80 turns, so its p99 is its slowest
turn; the pooled percentiles are what a tail claim should rest on.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import Any

from radixlang.runtime.engine import Engine

SYSTEM = ("You are a coding agent. You may call tools: read_file(path), run_tests(), grep(pattern), "
          "edit(path, patch). After each tool result, say what you do next in one short line.\n")
WORDS = ("module test failed passed line error import value config cache request token kernel layer "
         "batch queue thread lock return none true false path file read write index slot node tree").split()
CONFIGS = ("off", "pins", "pins+host")


@dataclass
class Workload:
    agents: int = 16
    min_turns: int = 8
    max_turns: int = 12
    tool_words: int = 60  # ~120 tokens of tool result per turn
    max_new_tokens: int = 12
    min_wait: float = 0.2
    max_wait: float = 2.0
    background_concurrency: int = 2
    background_words: int = 150
    seed: int = 0


@dataclass(slots=True)
class Turn:
    """One agent turn (--diagnose reads the kinds and the tail: where recomputes and slow turns come from)."""

    kind: str  # "first" (a session's first turn), "turn", "sub" (a sub-agent's)
    ttft: float
    prompt: int
    cached: int
    reusable: int  # tokens of this session's previous sequence (prompt + output) that this prompt repeats


@dataclass
class Measures:
    log: list[Turn] = field(default_factory=list)  # agent turns
    background_tokens: int = 0


def tool_result(rng: random.Random, n: int) -> str:
    return " ".join(f"{rng.choice(WORDS)}{rng.randint(0, 99)}" for _ in range(n))


async def one_turn(engine: Engine, prompt: str, key: str | None, wl: Workload, m: Measures,
                   kind: str = "turn", reusable: int = 0) -> tuple[str, int]:
    """Runs one turn; its text and the length of its sequence (prompt + output tokens)."""
    params = {"temperature": 0, "max_new_tokens": wl.max_new_tokens, "ignore_eos": True}
    t0, first, parts, length = time.perf_counter(), None, [], 0
    async for chunk in engine.async_stream(prompt, params, cache_key=key):
        if first is None and (chunk.token_ids or chunk.finished):
            first = time.perf_counter() - t0
        parts.append(chunk.text)
        if chunk.finished:
            m.log.append(Turn(kind, first or 0.0, chunk.prompt_tokens, chunk.cached_tokens, reusable))
            length = chunk.prompt_tokens + chunk.completion_tokens
    return "".join(parts), length


async def agent(engine: Engine, i: int, wl: Workload, keyed: bool, m: Measures) -> None:
    rng = random.Random(wl.seed * 1000 + i)
    turns = rng.randint(wl.min_turns, wl.max_turns)
    forks = rng.randint(2, 3) if i % 2 == 0 else 0
    history = SYSTEM + f"Task {i}: fix the failing test in module_{i}.py\n"
    key = f"agent-{i}" if keyed else None
    last = 0  # the previous turn's sequence length: what this turn could reuse
    for t in range(turns):
        out, length = await one_turn(engine, history + "Assistant:", key, wl, m, "turn" if t else "first", last)
        history += "Assistant:" + out + "\n"
        last = length - 1  # the last output token has no KV
        await asyncio.sleep(rng.uniform(wl.min_wait, wl.max_wait))  # the tool runs
        if forks and t == turns // 2:
            notes = await asyncio.gather(*(sub_agent(engine, history, i, j, wl, keyed, m) for j in range(forks)))
            history += "".join(f"Subagent {j}: {note}\n" for j, note in enumerate(notes))
        history += "Tool: " + tool_result(rng, wl.tool_words) + "\n"
    if keyed:
        await asyncio.to_thread(engine.release_cache_key, key)  # the session is over


async def sub_agent(engine: Engine, history: str, i: int, j: int, wl: Workload, keyed: bool, m: Measures) -> str:
    rng = random.Random(wl.seed * 1000 + i * 10 + j + 500_000)
    prompt = history + f"Subagent {j} task: review part {j} of the change.\n"
    key = f"agent-{i}-sub-{j}" if keyed else None
    out, last = "", 0
    for _ in range(2):
        out, length = await one_turn(engine, prompt + "Assistant:", key, wl, m, "sub", last)
        last = length - 1
        prompt += "Assistant:" + out + "\nTool: " + tool_result(rng, wl.tool_words // 2) + "\n"
        await asyncio.sleep(rng.uniform(wl.min_wait, wl.max_wait) / 2)
    if keyed:
        await asyncio.to_thread(engine.release_cache_key, key)
    return out


async def background(engine: Engine, wl: Workload, stop: asyncio.Event, m: Measures, worker: int) -> None:
    rng, n = random.Random(wl.seed + 7_000_000 + worker), 0
    params = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
    while not stop.is_set():
        prompt = f"Background job {worker}-{n}: " + tool_result(rng, wl.background_words)
        out = await engine.async_generate(prompt, params)
        m.background_tokens += out.meta.prompt_tokens + out.meta.completion_tokens
        n += 1


async def run_config(engine: Engine, wl: Workload, keyed: bool) -> tuple[Measures, Measures, float]:
    agents_m, background_m, stop = Measures(), Measures(), asyncio.Event()
    bg = [asyncio.create_task(background(engine, wl, stop, background_m, w)) for w in range(wl.background_concurrency)]
    t0 = time.perf_counter()
    await asyncio.gather(*(agent(engine, i, wl, keyed, agents_m) for i in range(wl.agents)))
    span = time.perf_counter() - t0
    stop.set()
    await asyncio.gather(*bg)
    return agents_m, background_m, span


def working_set(engine: Engine, wl: Workload) -> int:
    """Tokens of every agent's final history (outputs at max_new_tokens), sub-agents' extra included."""
    total = 0
    for i in range(wl.agents):
        rng = random.Random(wl.seed * 1000 + i)
        turns = rng.randint(wl.min_turns, wl.max_turns)
        forks = rng.randint(2, 3) if i % 2 == 0 else 0
        text = SYSTEM + f"Task {i}: fix the failing test in module_{i}.py\n"
        for _ in range(turns):
            rng.uniform(wl.min_wait, wl.max_wait)
            text += "Tool: " + tool_result(rng, wl.tool_words) + "\n"
        total += len(engine.tokenizer.encode(text)) + turns * (wl.max_new_tokens + 4)
        total += forks * (wl.tool_words * 2 + 2 * wl.max_new_tokens + 40)
    return total


@dataclass
class Result:
    """One config's measures in one or more rounds (`pooled` merges rounds)."""

    name: str
    agents: Measures
    background: Measures
    span: float
    stats: dict[str, float]  # engine counters accrued in the measured window(s)
    pool: int


def counters(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    keys = ("recomputed_cached_tokens_total", "pins_released_under_pressure_total", "pins_expired_total",
            "preemptions_total", "priority_preemptions_total", "host_restored_tokens_total")
    return {k: after[k] - before[k] for k in keys}


def pooled(results: list[Result]) -> Result:
    """Every round's turns and totals of one config, as one run."""
    first = results[0]
    agents_m, background_m = Measures(), Measures()
    for r in results:
        agents_m.log += r.agents.log
        background_m.background_tokens += r.background.background_tokens
    stats = {k: sum(r.stats[k] for r in results) for k in first.stats}
    return Result(first.name, agents_m, background_m, sum(r.span for r in results), stats, first.pool)


def percentile(sorted_values: list[float], q: float) -> float:
    """Nearest rank: with ~50 values the p99 is the slowest one."""
    return sorted_values[min(len(sorted_values) - 1, int(q * len(sorted_values)))]


def summarize(res: Result) -> dict[str, Any]:
    log, stats = res.agents.log, res.stats
    ttft = sorted(t.ttft for t in log)
    return {"config": res.name, "agent_turns": len(log),
            "recomputed_tokens_per_turn": stats["recomputed_cached_tokens_total"] / len(log),
            "prefilled_tokens_per_turn": statistics.mean(t.prompt - t.cached for t in log),
            "ttft_p50_s": statistics.median(ttft), "ttft_p95_s": percentile(ttft, 0.95),
            "ttft_p99_s": percentile(ttft, 0.99),
            "agent_turns_per_s": len(log) / res.span,
            "background_tokens_per_s": res.background.background_tokens / res.span,
            "seconds": res.span, "pins_released_under_pressure": stats["pins_released_under_pressure_total"],
            "host_restored_tokens": stats["host_restored_tokens_total"], "pool": res.pool,
            "diagnosis": diagnose(log, stats)}


def diagnose(log: list[Turn], stats: dict[str, float]) -> dict[str, Any]:
    """Where the prefill goes: per kind of turn, the tokens of the session's previous sequence that were
    not found cached ("lost"), and what the slowest 5% of turns (the TTFT tail) prefilled."""
    out: dict[str, Any] = {k: stats[k] for k in ("pins_released_under_pressure_total", "pins_expired_total",
                                                  "preemptions_total", "priority_preemptions_total",
                                                  "host_restored_tokens_total")}
    for kind in ("first", "turn", "sub"):
        turns = [t for t in log if t.kind == kind]
        if turns:
            out[kind] = {"turns": len(turns), "prompt": statistics.mean(t.prompt for t in turns),
                         "prefilled": statistics.mean(t.prompt - t.cached for t in turns),
                         "lost": statistics.mean(max(0, t.reusable - t.cached) for t in turns),
                         "ttft_p50": statistics.median(t.ttft for t in turns)}
    tail = sorted(log, key=lambda t: -t.ttft)[:max(1, len(log) // 20)]
    out["tail"] = [(t.kind, round(t.ttft, 2), t.prompt, t.prompt - t.cached) for t in tail]
    return out


def main(argv: list[str] | None = None) -> list[dict[str, Any]]:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None, help="GGUF file or HF folder (default: SmolLM2-135M-Instruct)")
    parser.add_argument("--agents", type=int, default=16)
    parser.add_argument("--min-turns", type=int, default=8)
    parser.add_argument("--max-turns", type=int, default=12)
    parser.add_argument("--max-wait", type=float, default=2.0, help="longest tool wait (s); the shortest is 0.2")
    parser.add_argument("--pool-share", type=float, default=0.5, help="KV pool / agents' working set")
    parser.add_argument("--background-words", type=int, default=150, help="words per background prompt (~2 tokens each)")
    parser.add_argument("--background-concurrency", type=int, default=2, help="background requests in flight")
    parser.add_argument("--max-pinned-fraction", type=float, default=None, help="engine option (default: the engine's)")
    parser.add_argument("--configs", default=",".join(CONFIGS), help="which of off,pins,pins+host to run (off first)")
    parser.add_argument("--rounds", type=int, default=1, help="rounds of every config; round r uses seed --seed + r")
    parser.add_argument("--seed", type=int, default=0, help="the first round's workload seed")
    parser.add_argument("--json", default=None, help="also write the rows to this file")
    parser.add_argument("--diagnose", action="store_true", help="also print where prefill and the TTFT tail come from")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        raise SystemExit(f"--rounds must be >= 1, got {args.rounds}")
    names = args.configs.split(",")
    for name in names:
        if name not in CONFIGS:
            raise SystemExit(f"--configs: {name!r} is not one of {CONFIGS}")
    options = {} if args.max_pinned_fraction is None else {"max_pinned_fraction": args.max_pinned_fraction}
    results: dict[str, list[Result]] = {name: [] for name in names}
    rows = []
    for rnd in range(args.rounds):
        wl = Workload(agents=args.agents, min_turns=args.min_turns, max_turns=args.max_turns,
                      min_wait=min(0.2, args.max_wait), max_wait=args.max_wait,
                      background_words=args.background_words,
                      background_concurrency=args.background_concurrency, seed=args.seed + rnd)
        probe = Engine(args.model, device="cpu", kv_cache_tokens=4096)
        pool = int(working_set(probe, wl) * args.pool_share)
        probe.shutdown()
        for name in names:
            res = run_one(args.model, name, wl, pool, options)
            results[name].append(res)
            r = summarize(res) | {"round": rnd, "seed": wl.seed}
            rows.append(r)  # as each config ends: a run cut short still reports what it measured
            print(f"round {rnd} (seed {wl.seed}) {name}: p50/p95/p99 TTFT {r['ttft_p50_s']:.2f}/{r['ttft_p95_s']:.2f}/"
                  f"{r['ttft_p99_s']:.2f} s over {r['agent_turns']} turns, recomputed/turn "
                  f"{r['recomputed_tokens_per_turn']:.1f}, background {r['background_tokens_per_s']:.1f} tok/s, "
                  f"{res.span:.0f} s", flush=True)
        if args.rounds > 1:
            print(f"-- round {rnd}, seed {wl.seed}")
            print_rows([x for x in rows if x["round"] == rnd])
    if args.rounds > 1:
        pooled_rows = [summarize(pooled(results[name])) | {"round": "pooled"} for name in names]
        print(f"-- pooled over {args.rounds} rounds (seeds {args.seed}-{args.seed + args.rounds - 1})")
        print_rows(pooled_rows)
        rows += pooled_rows
    else:
        print_rows(rows)
    if args.diagnose:
        for r in rows:
            print(r["config"], r["round"], json.dumps(r["diagnosis"]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=2)
    return rows


def run_one(model: str | None, name: str, wl: Workload, pool: int, options: dict[str, float]) -> Result:
    """One config on a fresh engine."""
    host = {} if name == "pins+host" else {"kv_host_cache_tokens": 0}  # the tier at its default size, or none
    # eager decode in every config: with compile_layers="auto" a config may start a background compile
    # (once another finished on this machine) whose thread takes the cores inside its measured window
    engine = Engine(model, device="cpu", kv_cache_tokens=pool, max_running_requests=64,
                    compile_layers=False, **host, **options)
    try:
        before = engine.stats()
        agents_m, background_m, span = asyncio.run(run_config(engine, wl, keyed=name != "off"))
        engine.check_invariants()
        return Result(name, agents_m, background_m, span, counters(before, engine.stats()), pool)
    finally:
        engine.shutdown()


def print_rows(rows: list[dict[str, Any]]) -> None:
    off = rows[0]
    print(f"KV pool {off['pool']} tokens (about half the agents' working set); cores may be shared: ratios only")
    print(f"{'config':10} {'turns':>5} {'recomp/turn':>11} {'prefill/turn':>12} {'ttft p50':>9} {'ttft p95':>9} "
          f"{'ttft p99':>9} {'turns/s':>8} {'bg tok/s':>9} {'pins freed':>10} {'host restored':>13}")
    for r in rows:
        print(f"{r['config']:10} {r['agent_turns']:5d} {r['recomputed_tokens_per_turn']:11.1f} "
              f"{r['prefilled_tokens_per_turn']:12.1f} {r['ttft_p50_s']:9.3f} {r['ttft_p95_s']:9.3f} "
              f"{r['ttft_p99_s']:9.3f} {r['agent_turns_per_s']:8.2f} {r['background_tokens_per_s']:9.1f} "
              f"{r['pins_released_under_pressure']:10.0f} {r['host_restored_tokens']:13.0f}")
    for r in rows[1:]:
        left = r["recomputed_tokens_per_turn"]
        recomputed = f"{off['recomputed_tokens_per_turn'] / left:.1f}x fewer" if left else "no"
        print(f"{r['config']} vs {off['config']}: {recomputed} recomputed tokens, "
              f"{off['ttft_p95_s'] / r['ttft_p95_s']:.2f}x lower p95 / "
              f"{off['ttft_p99_s'] / r['ttft_p99_s']:.2f}x lower p99 TTFT, "
              f"{r['agent_turns_per_s'] / off['agent_turns_per_s']:.2f}x agent turns/s, "
              f"background {r['background_tokens_per_s'] / off['background_tokens_per_s']:.2f}x of off")


if __name__ == "__main__":
    main()
