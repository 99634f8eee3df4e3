"""Scale-out behind SGLang's router: programs through `rl.Endpoint(router)` (one routed call per primitive).

Fleets, each started as `radixlang serve --dp N` would (server/fleet.py), on the same machine, one after
another with the same programs and the same memory in all:
  - 1 worker x all threads, behind the router, its KV pool the whole fleet's (the single-engine baseline:
    its cache hit rate is the goal)
  - 2 workers x half the threads and half the KV each, router `cache_aware`
  - 2 workers x half the threads and half the KV each, router `round_robin`
Scale-out exists because the working set outgrows one engine, so the KV is sized to the chat workload: its
working set (every session's whole conversation, replies at their max_tokens, counted with the model's
tokenizer and chat template) is what the single worker holds, and each of 2 workers holds half of it (no
host tier: the pool is all the KV a worker keeps). Round robin sends every session's turns to both
workers, so each must hold all of them and its LRU evicts histories before their next turn; cache_aware
keeps a session on one worker, so each holds its half.

Workloads from the program suite: few-shot QA and tree of thought (`--concurrency` programs in flight),
and multi-turn chat: `--programs` sessions, all in flight at once, each its own user with its own notes,
4 turns of 6-sentence messages and 24-token replies. Each fleet is measured once its workers' background
compile of the decode forward (on by default for `radixlang serve`) has finished, so that no compile
thread takes CPU inside the measured window; `--eager` serves eager decode instead (no compile: on a
loaded shared VM a cold compile takes many minutes per worker). Reported per fleet and workload: the
workers' cache hit rate over the run (cached / prompt tokens from their /metrics), programs/s, p50/p99
program latency, the busiest worker's share of the prompt tokens, and the load average.

    python -m benchmark.scale_out [--model M] [--programs 16] [--concurrency 8] [--threads 2] [--eager]
    python -m benchmark.scale_out --remote-only   # remote=True on one worker vs per primitive via the router

On a GPU machine each worker gets one GPU (CUDA_VISIBLE_DEVICES). Needs `pip install 'radixlang[router]'`.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable

import httpx
import psutil

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
    all_at_once: bool = False  # every item in flight together (chat sessions), else --concurrency at a time


CHAT = Program("multi-turn chat", multi_turn.chat, multi_turn.make_sessions, all_at_once=True)
PROGRAMS = [Program("few-shot QA", few_shot.few_shot_qa, few_shot.make_items), CHAT,
            Program("tree of thought", tree_of_thought.tree_of_thought, tree_of_thought.make_items)]


def chat_working_set(model: str | None, sessions: list[dict]) -> int:
    """Tokens of every session's whole conversation (replies at max_tokens), as the served model counts them:
    what one engine must keep to find every turn's history cached."""
    from radixlang.runtime.models.loader import default_model_path, gguf_metadata
    from radixlang.runtime.tokenizer import Tokenizer

    path = model or str(default_model_path())
    tokenizer = (Tokenizer.from_gguf_metadata(gguf_metadata(path)) if path.endswith(".gguf")
                 else Tokenizer.from_hf_dir(path))
    total = 0
    for session in sessions:
        messages = [{"role": "system", "content": multi_turn.SYSTEM}]
        for message in session["turns"]:
            messages += [{"role": "user", "content": message}, {"role": "assistant", "content": ""}]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=False)
        total += len(tokenizer.encode(text)) + session["max_tokens"] * len(session["turns"])
    return total


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
        state = program.function.run(**{k: v for k, v in item.items() if k in params}, backend=endpoint,
                                     temperature=0)
        if state.error() is not None:  # a failed program would count as a fast one
            raise RuntimeError(f"{program.name} failed: {state.error()}")
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
    before, cpu_before = cache_counters(fleet.worker_urls), workers_cpu_s(fleet)
    started = time.perf_counter()
    latencies = run_programs(fleet.url, program, items, len(items) if program.all_at_once else concurrency)
    wall = time.perf_counter() - started
    after, cpu_s = cache_counters(fleet.worker_urls), workers_cpu_s(fleet) - cpu_before
    prompts = [p1 - p0 for (p0, _), (p1, _) in zip(before, after)]
    cached = [c1 - c0 for (_, c0), (_, c1) in zip(before, after)]
    return {"cache_hit_rate": sum(cached) / max(sum(prompts), 1.0), "programs_per_s": len(items) / wall,
            "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99),
            "busiest_worker_share": max(prompts) / max(sum(prompts), 1.0),  # of the prompt tokens
            "worker_cpu_s_per_program": cpu_s / len(items),  # the work done, whatever else runs beside it
            "load_avg_1min": os.getloadavg()[0]}  # the machine's, at the end: other jobs share the cores


def workers_cpu_s(fleet: Fleet) -> float:
    """CPU seconds the fleet's workers have used (all their threads)."""
    return sum(sum(psutil.Process(w.pid).cpu_times()[:2]) for w in fleet.workers)


def measure_remote_choice(args: argparse.Namespace) -> dict[str, Any]:
    """What `remote=True` costs behind a router, where it is refused: the remote-program workload's programs,
    one after another, per primitive through the router (what a user does instead) against remote=True
    straight to one worker (what bypassing the router would give), on a 2-worker cache_aware fleet."""
    from .programs import remote

    fleet = Fleet(fleet_spec(args, 2, "cache_aware", args.kv_cache_tokens or 16384))
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


def fleet_spec(args: argparse.Namespace, dp: int, policy: str, kv_tokens: int) -> FleetSpec:
    """`kv_tokens`: each worker's KV pool, and all the KV it keeps (no host tier)."""
    worker_args = ["--device", args.device, "--kv-cache-tokens", str(kv_tokens), "--kv-host-cache-tokens", "0",
                   "--compile-layers", "false" if args.eager else "true"]
    if args.model:
        worker_args += ["--model", args.model]
    return FleetSpec(host=HOST, port=free_port(HOST), dp=dp, worker_args=worker_args, policy=policy,
                     threads_per_worker=max(1, args.threads // dp), grace_s=5.0, log_level="warning")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kv-cache-tokens", type=int, default=None,
                        help="KV tokens of each of 2 workers (the single worker: twice this); "
                             "default: half the chat workload's working set")
    parser.add_argument("--programs", type=int, default=16, help="programs per workload (chat: sessions)")
    parser.add_argument("--concurrency", type=int, default=8, help="programs in flight at once")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of the whole fleet")
    parser.add_argument("--workloads", nargs="+", default=[p.name for p in PROGRAMS],
                        choices=[p.name for p in PROGRAMS], metavar="NAME", help="a subset of: %(choices)s")
    parser.add_argument("--eager", action="store_true", help="workers decode eagerly (no background compile)")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--remote-only", action="store_true",
                        help="only measure remote=True on a worker against per-primitive calls through the router")
    args = parser.parse_args()
    if args.remote_only:
        measure_remote_choice(args)
        return
    working_set = chat_working_set(args.model, CHAT.make_items(args.programs))
    per_worker = args.kv_cache_tokens or working_set // 2
    print(f"chat working set {working_set} tokens; KV per worker: 1 worker {2 * per_worker}, 2 workers "
          f"{per_worker} each", flush=True)
    half = max(1, args.threads // 2)
    fleets = [(f"1 worker x {args.threads} threads", 1, "cache_aware"),
              (f"2 workers x {half} thread(s), cache_aware", 2, "cache_aware"),
              (f"2 workers x {half} thread(s), round_robin", 2, "round_robin")]
    results: dict[str, dict[str, Any]] = {}
    for label, dp, policy in fleets:
        fleet = Fleet(fleet_spec(args, dp, policy, 2 * per_worker // dp))
        fleet.start()
        try:
            wait_compiled(fleet.worker_urls)
            run_programs(fleet.url, PROGRAMS[0], PROGRAMS[0].make_items(2), 2)  # warm-up: threads, first allocations
            for program in (p for p in PROGRAMS if p.name in args.workloads):
                results.setdefault(program.name, {})[label] = measure_fleet(
                    fleet, program, program.make_items(args.programs), args.concurrency)
                print(label, program.name, json.dumps(results[program.name][label]), flush=True)
        finally:
            fleet.stop()
    report(results, [f[0] for f in fleets])
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"chat_working_set_tokens": working_set, "kv_tokens_per_worker": per_worker, **results}, f,
                      indent=2)


def report(results: dict[str, dict[str, Any]], labels: list[str]) -> None:
    print("\nOne run; the machine's cores are shared with other work, so absolute rates are noisy.")
    print(f"{'workload':<18}{'fleet':<52}{'hit rate':>9}{'prog/s':>8}{'p50 s':>8}{'p99 s':>8}{'busiest':>8}"
          f"{'cpu s/prog':>11}{'load':>6}")
    for name, by_fleet in results.items():
        for label in labels:
            r = by_fleet[label]
            print(f"{name:<18}{label:<52}{r['cache_hit_rate']:>9.3f}{r['programs_per_s']:>8.2f}"
                  f"{r['p50_s']:>8.2f}{r['p99_s']:>8.2f}{r['busiest_worker_share']:>8.2f}"
                  f"{r['worker_cpu_s_per_program']:>11.2f}{r['load_avg_1min']:>6.1f}")
        single, aware, rr = (by_fleet[label] for label in labels)
        print(f"{'':<18}cache_aware keeps {aware['cache_hit_rate'] / max(single['cache_hit_rate'], 1e-9):.0%} of "
              f"the single worker's hit rate (round_robin {rr['cache_hit_rate'] / max(single['cache_hit_rate'], 1e-9):.0%}); "
              f"cache_aware / round_robin programs/s {aware['programs_per_s'] / rr['programs_per_s']:.2f}x, "
              f"worker CPU s per program {aware['worker_cpu_s_per_program'] / rr['worker_cpu_s_per_program']:.2f}x; "
              f"2 workers / 1 programs/s {aware['programs_per_s'] / single['programs_per_s']:.2f}x, "
              f"p99 {aware['p99_s']:.1f} s against {single['p99_s']:.1f} s")


if __name__ == "__main__":
    main()
