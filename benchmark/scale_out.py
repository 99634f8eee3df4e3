"""Scale-out behind SGLang's router: programs through `rl.Endpoint(router)` (one routed call per primitive).

Fleets, each started as `radixlang serve --dp N` would (server/fleet.py), on the same machine, one after
another with the same programs:
  - 1 worker x all threads, behind the router (the single-engine baseline: its cache hit rate is the goal)
  - 2 workers x half the threads each, router `cache_aware`
  - 2 workers x half the threads each, router `round_robin`
Workloads from the program suite: few-shot QA, multi-turn chat (its two variants: short turns, where the
shared system prompt is most of a prompt, and long turns, where each conversation's own history is), tree
of thought. Programs run `--concurrency` at a time. Each fleet is measured once its workers' background
compile of the decode forward (on by default for `radixlang serve`) has finished, so that no compile
thread takes CPU inside the measured window, and every fleet runs the decode that a served fleet runs;
`--eager` serves eager decode instead (no compile: on a loaded shared VM a cold compile takes many minutes
per worker). Reported per fleet and workload: the workers' cache hit rate over the run (cached /
prompt tokens from their /metrics), programs/s, p50/p99 program latency, and the busiest worker's share of
the prompt tokens.

    python -m benchmark.scale_out [--model M] [--programs 16] [--concurrency 8] [--threads 2]
    python -m benchmark.scale_out --remote-only   # remote=True on one worker vs per primitive via the router

On a GPU machine each worker gets one GPU (CUDA_VISIBLE_DEVICES). Needs `pip install 'radixlang[router]'`.
"""
from __future__ import annotations

import argparse
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import httpx

import radixlang as rl
from radixlang.server.fleet import Fleet, FleetSpec, free_port

from .programs import few_shot, multi_turn, tree_of_thought
from .programs.measure import percentile

HOST = "127.0.0.1"


@dataclass(slots=True)
class Program:
    name: str
    function: Any  # an rl.function
    make_items: Callable[[int], list[dict]]


PROGRAMS = [Program("few-shot QA", few_shot.few_shot_qa, few_shot.make_items),
            Program("multi-turn chat", multi_turn.chat, multi_turn.make_short),
            Program("chat, long turns", multi_turn.chat, multi_turn.make_long),
            Program("tree of thought", tree_of_thought.tree_of_thought, tree_of_thought.make_items)]


def cache_counters(workers: list[str]) -> list[tuple[float, float]]:
    """(prompt tokens, cached tokens) of each worker, from its /metrics."""
    counters = []
    for worker in workers:
        values = {}
        for line in httpx.get(f"{worker}/metrics", timeout=30).text.splitlines():
            name, _, value = line.partition("{")
            if name in ("radixlang_prompt_tokens_total", "radixlang_cached_tokens_total"):
                values[name] = float(value.rsplit(" ", 1)[1])
        counters.append((values["radixlang_prompt_tokens_total"], values["radixlang_cached_tokens_total"]))
    return counters


def run_programs(url: str, program: Program, items: list[dict], concurrency: int) -> list[float]:
    endpoint = rl.Endpoint(url)

    def one(item: dict) -> float:
        started = time.perf_counter()
        params = program.function.signature.parameters  # items may carry expected answers too
        program.function.run(**{k: v for k, v in item.items() if k in params}, backend=endpoint, temperature=0)
        return time.perf_counter() - started

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, items))


def wait_compiled(workers: list[str], timeout: float = 900.0) -> None:
    """Until no worker's background compile of its decode forward is running (see /server_info)."""
    deadline = time.monotonic() + timeout
    while any(httpx.get(f"{w}/server_info", timeout=30).json()["decode_compile"] == "compiling" for w in workers):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers' decode compile did not finish within {timeout:.0f} s")
        time.sleep(2)


def measure_fleet(fleet: Fleet, program: Program, items: list[dict], concurrency: int) -> dict[str, Any]:
    httpx.post(f"{fleet.url}/flush_cache", timeout=60)  # every fleet starts each workload cold
    before = cache_counters(fleet.worker_urls)
    started = time.perf_counter()
    latencies = run_programs(fleet.url, program, items, concurrency)
    wall = time.perf_counter() - started
    after = cache_counters(fleet.worker_urls)
    prompts = [p1 - p0 for (p0, _), (p1, _) in zip(before, after)]
    cached = [c1 - c0 for (_, c0), (_, c1) in zip(before, after)]
    return {"cache_hit_rate": sum(cached) / max(sum(prompts), 1.0), "programs_per_s": len(items) / wall,
            "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99),
            "busiest_worker_share": max(prompts) / max(sum(prompts), 1.0)}  # of the prompt tokens


def measure_remote_choice(args: argparse.Namespace) -> dict[str, Any]:
    """What `remote=True` costs behind a router, where it is refused: the remote-program workload's programs,
    one after another, per primitive through the router (what a user does instead) against remote=True
    straight to one worker (what bypassing the router would give), on a 2-worker cache_aware fleet."""
    from .programs import remote

    fleet = Fleet(fleet_spec(args, 2, "cache_aware"))
    fleet.start()
    try:
        wait_compiled(fleet.worker_urls)
        items = remote.make_items(args.programs // 2)
        out = {}
        for label, url, is_remote in [("per primitive through the router", fleet.url, False),
                                      ("remote=True on one worker", fleet.worker_urls[0], True)]:
            httpx.post(f"{fleet.url}/flush_cache", timeout=60)
            latencies = remote.run_each(rl.Endpoint(url), items, remote=is_remote).latencies
            out[label] = {"programs_per_s": len(items) / sum(latencies), "p50_s": percentile(latencies, 50),
                          "p99_s": percentile(latencies, 99)}
            print(label, json.dumps(out[label]), flush=True)
        return out
    finally:
        fleet.stop()


def fleet_spec(args: argparse.Namespace, dp: int, policy: str) -> FleetSpec:
    worker_args = ["--device", args.device, "--kv-cache-tokens", str(args.kv_cache_tokens),
                   "--compile-layers", "false" if args.eager else "true"]
    if args.model:
        worker_args += ["--model", args.model]
    return FleetSpec(host=HOST, port=free_port(HOST), dp=dp, worker_args=worker_args, policy=policy,
                     threads_per_worker=max(1, args.threads // dp), grace_s=5.0, log_level="warning")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kv-cache-tokens", type=int, default=16384)
    parser.add_argument("--programs", type=int, default=16, help="programs per workload")
    parser.add_argument("--concurrency", type=int, default=8, help="programs in flight at once")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of the whole fleet")
    parser.add_argument("--eager", action="store_true", help="workers decode eagerly (no background compile)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--remote-only", action="store_true",
                        help="only measure remote=True on a worker against per-primitive calls through the router")
    args = parser.parse_args()
    if args.remote_only:
        measure_remote_choice(args)
        return
    half = max(1, args.threads // 2)
    fleets = [(f"1 worker x {args.threads} threads", 1, "cache_aware"),
              (f"2 workers x {half} thread(s), cache_aware", 2, "cache_aware"),
              (f"2 workers x {half} thread(s), round_robin", 2, "round_robin")]
    results: dict[str, dict[str, Any]] = {}
    for label, dp, policy in fleets:
        fleet = Fleet(fleet_spec(args, dp, policy))
        fleet.start()
        try:
            wait_compiled(fleet.worker_urls)
            run_programs(fleet.url, PROGRAMS[0], PROGRAMS[0].make_items(2), 2)  # warm-up: threads, first allocations
            for program in PROGRAMS:
                results.setdefault(program.name, {})[label] = measure_fleet(
                    fleet, program, program.make_items(args.programs), args.concurrency)
                print(label, program.name, json.dumps(results[program.name][label]), flush=True)
        finally:
            fleet.stop()
    report(results, [f[0] for f in fleets])
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


def report(results: dict[str, dict[str, Any]], labels: list[str]) -> None:
    print("\nOne run; the machine's cores are shared with other work, so absolute rates are noisy.")
    print(f"{'workload':<18}{'fleet':<52}{'hit rate':>9}{'prog/s':>8}{'p50 s':>8}{'p99 s':>8}{'busiest':>8}")
    for name, by_fleet in results.items():
        for label in labels:
            r = by_fleet[label]
            print(f"{name:<18}{label:<52}{r['cache_hit_rate']:>9.3f}{r['programs_per_s']:>8.2f}"
                  f"{r['p50_s']:>8.2f}{r['p99_s']:>8.2f}{r['busiest_worker_share']:>8.2f}")
        single, aware, rr = (by_fleet[label] for label in labels)
        print(f"{'':<18}cache_aware keeps {aware['cache_hit_rate'] / max(single['cache_hit_rate'], 1e-9):.0%} of "
              f"the single worker's hit rate (round_robin {rr['cache_hit_rate'] / max(single['cache_hit_rate'], 1e-9):.0%}); "
              f"cache_aware / round_robin programs/s {aware['programs_per_s'] / rr['programs_per_s']:.2f}x; "
              f"2 workers / 1 programs/s {aware['programs_per_s'] / single['programs_per_s']:.2f}x, "
              f"p99 {aware['p99_s']:.1f} s against {single['p99_s']:.1f} s")


if __name__ == "__main__":
    main()
