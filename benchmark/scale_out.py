"""Scale-out behind SGLang's router: programs through `rl.Endpoint(router)` (one routed call per primitive).

Three setups, all started as `radixlang serve --dp N` would (server/fleet.py) and all up for the whole run,
with the same programs and the same KV memory in all:
  - 1 worker x all threads, behind the router, its KV pool the whole fleet's (the single-engine baseline:
    its cache hit rate is the goal)
  - N workers (`--workers`, 2) x their share of the threads and of the KV, router `cache_aware`
  - the same N worker processes behind a second router, `round_robin`
The two policies run on the same worker processes, so they differ in routing only. Each workload runs
`--trials` times; in each trial the setups run one after another, in an order rotated from trial to trial,
each from a flushed cache. The same-trial ratios (neighbours in time, so under about the same load from
other jobs) and their median are the result; every trial is printed too. Before the trials every setup
runs a small warm-up of each workload (first allocations, thread pools, the router's connections).

Scale-out exists because the working set outgrows one engine, so the KV is sized to the chat workload: its
working set (every session's whole conversation, replies at their max_tokens, counted with the model's
tokenizer and chat template) is what the single worker holds, and each of N workers holds 1/N of it. The
host KV tier is off (`--host-tier off`): with it on (its default, two device pools of host memory) a
worker's evicted KV comes back from the host and a worker effectively keeps 3/N of the working set, which
undoes the sizing; `--host-tier default` measures that. Reported per setup, workload and trial: where the
prompt tokens came from (from the workers' /metrics: device radix hits, of which host-tier restores;
misses that were cached on that worker before and evicted; misses never seen there), for the chat each
turn's hit rate, programs/s, p50/p99 program latency, the busiest worker's share of the prompt tokens, the
workers' CPU seconds per program and the cores they got (CPU seconds over wall time: other jobs take the
rest), and the load average at the start and the end.

Workloads from the program suite: few-shot QA and tree of thought (`--concurrency` programs in flight),
and multi-turn chat: `--programs` sessions, all in flight at once, each its own user with its own notes,
4 turns of 6-sentence messages and 24-token replies. Measuring starts once every worker's background
compile of the decode forward (on by default for `radixlang serve`) has finished, so that no compile
thread takes CPU inside the measured window; `--eager` serves eager decode instead (no compile: on a
loaded shared VM a cold compile takes many minutes per worker). Each of the N workers (all its threads)
runs on its own core, as each would have its own GPU (`--no-pin`: where the kernel puts them).

    python -m benchmark.scale_out [--model M] [--programs 16] [--concurrency 8] [--threads 2] [--trials 3]
                                  [--workers 2] [--eager] [--no-pin] [--host-tier off|default]
    python -m benchmark.scale_out --remote-only   # remote=True on one worker vs per primitive via the router

On a GPU machine each worker gets one GPU (CUDA_VISIBLE_DEVICES). Needs `pip install sglang-router`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import astuple, dataclass
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
    turns: Callable[[dict], list[str]] | None = None  # an item's gen variables, one per turn (hit rate per turn)


CHAT = Program("multi-turn chat", multi_turn.chat, multi_turn.make_sessions, all_at_once=True,
               turns=lambda item: [f"reply{i}" for i in range(len(item["turns"]))])
PROGRAMS = [Program("few-shot QA", few_shot.few_shot_qa, few_shot.make_items), CHAT,
            Program("tree of thought", tree_of_thought.tree_of_thought, tree_of_thought.make_items)]


@dataclass(slots=True)
class Setup:
    label: str
    url: str  # its router
    fleet: Fleet  # its workers (the two policies share one fleet's)


@dataclass(slots=True)
class TokenCounters:
    """A worker's prompt-token counters (its /metrics): what was cached, and what of that came back from the
    host tier; what was prefilled again after its eviction."""

    prompt: float = 0.0
    cached: float = 0.0  # device radix hits, host-tier restores included
    host_restored: float = 0.0
    evicted: float = 0.0  # misses on tokens this worker had cached before

    def __sub__(self, other: TokenCounters) -> TokenCounters:
        return TokenCounters(*(a - b for a, b in zip(astuple(self), astuple(other))))


METRIC_FIELDS = {"radixlang_prompt_tokens_total": "prompt", "radixlang_cached_tokens_total": "cached",
                 "radixlang_host_restored_tokens_total": "host_restored",
                 "radixlang_recomputed_cached_tokens_total": "evicted"}


def chat_working_set(model: str | None, sessions: list[dict]) -> int:
    """Tokens of every session's whole conversation (replies at max_tokens), as the served model counts them:
    what one engine must keep to find every turn's history cached."""
    from radixlang.runtime.models.loading.loader import default_model_path, gguf_metadata
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


def token_counters(workers: list[str]) -> list[TokenCounters]:
    counters = []
    for worker in workers:
        values = TokenCounters()
        for line in httpx.get(f"{worker}/metrics", timeout=30).text.splitlines():
            name, _, value = line.partition("{")
            if name in METRIC_FIELDS:
                setattr(values, METRIC_FIELDS[name], float(value.rsplit(" ", 1)[1]))
        counters.append(values)
    return counters


@dataclass(slots=True)
class ProgramRun:
    latency_s: float
    turns: list[tuple[int, int]]  # (prompt tokens, cached tokens) of each turn, for a program with turns


def run_programs(url: str, program: Program, items: list[dict], concurrency: int) -> list[ProgramRun]:
    endpoint = rl.Endpoint(url)

    def one(item: dict) -> ProgramRun:
        started = time.perf_counter()
        params = program.function.signature.parameters  # items may carry expected answers too
        state = program.function.run(**{k: v for k, v in item.items() if k in params}, backend=endpoint,
                                     temperature=0)
        if state.error() is not None:  # a failed program would count as a fast one
            raise RuntimeError(f"{program.name} failed: {state.error()}")
        latency = time.perf_counter() - started
        metas = [state.get_meta_info(name) for name in (program.turns(item) if program.turns else [])]
        return ProgramRun(latency, [(m["prompt_tokens"], m["cached_tokens"]) for m in metas])

    with ThreadPoolExecutor(concurrency) as pool:
        return list(pool.map(one, items))


def wait_compiled(workers: list[str], timeout: float = 900.0) -> None:
    """Until no worker's background compile of its decode forward is running (see /server_info)."""
    deadline = time.monotonic() + timeout
    while any(httpx.get(f"{w}/server_info", timeout=30).json()["decode_compile"] == "compiling" for w in workers):
        if time.monotonic() > deadline:
            raise RuntimeError(f"the workers' decode compile did not finish within {timeout:.0f} s")
        time.sleep(2)


def measure(setup: Setup, program: Program, items: list[dict], concurrency: int) -> dict[str, Any]:
    """One trial of `program` on `setup`, from a flushed cache."""
    workers = setup.fleet.worker_urls
    httpx.post(f"{setup.url}/flush_cache", timeout=60)
    load_start = os.getloadavg()[0]
    before, cpu_before = token_counters(workers), workers_cpu_s(setup.fleet)
    started = time.perf_counter()
    runs = run_programs(setup.url, program, items, len(items) if program.all_at_once else concurrency)
    wall = time.perf_counter() - started
    each_cpu_s = [a - b for a, b in zip(workers_cpu_s(setup.fleet), cpu_before)]
    cpu_s = sum(each_cpu_s)
    per_worker = [a - b for a, b in zip(token_counters(workers), before)]
    total = TokenCounters(*(sum(v) for v in zip(*(astuple(c) for c in per_worker))))
    prompt = max(total.prompt, 1.0)
    latencies = [r.latency_s for r in runs]
    turn_tokens = [(sum(r.turns[t][0] for r in runs), sum(r.turns[t][1] for r in runs))
                   for t in range(len(runs[0].turns))]  # (prompt, cached) of all programs' turn t
    return {"cache_hit_rate": total.cached / prompt,
            # where the prompt tokens came from: hit (of which from the host tier) + evicted + never seen = 1
            "host_restored_share": total.host_restored / prompt, "evicted_miss_share": total.evicted / prompt,
            "never_seen_miss_share": (total.prompt - total.cached - total.evicted) / prompt,
            "turn_hit_rates": [c / max(p, 1) for p, c in turn_tokens], "turn_tokens": turn_tokens,
            "programs_per_s": len(items) / wall, "wall_s": wall,
            "p50_s": percentile(latencies, 50), "p99_s": percentile(latencies, 99),
            "busiest_worker_share": max(c.prompt for c in per_worker) / prompt,
            "worker_cpu_s_per_program": cpu_s / len(items),  # the work done, whatever else runs beside it
            "worker_cores": cpu_s / wall,  # the CPU the workers got: other jobs take the rest
            "each_worker_cpu_s": each_cpu_s,
            "load_avg_1min": (load_start, os.getloadavg()[0])}  # the machine's: other jobs share the cores


def workers_cpu_s(fleet: Fleet) -> list[float]:
    """CPU seconds each of the fleet's workers has used (all its threads)."""
    return [sum(psutil.Process(w.pid).cpu_times()[:2]) for w in fleet.workers]


def pin_workers(fleet: Fleet) -> list[set[int]]:
    """Each worker, every thread of it, on its own core (round the cores); threads it starts later inherit
    it. Without it the kernel may run two workers on one core while the other runs other jobs."""
    cores = sorted(os.sched_getaffinity(0))
    placed = []
    for i, proc in enumerate(fleet.workers):
        cpus = {cores[i % len(cores)]}
        for tid in os.listdir(f"/proc/{proc.pid}/task"):
            os.sched_setaffinity(int(tid), cpus)
        placed.append(cpus)
    return placed


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
    """`kv_tokens`: each worker's KV pool (and, with the host tier off, all the KV it keeps)."""
    worker_args = ["--device", args.device, "--kv-cache-tokens", str(kv_tokens),
                   "--compile-layers", "false" if args.eager else "true"]
    if args.host_tier == "off":
        worker_args += ["--kv-host-cache-tokens", "0"]
    if args.model:
        worker_args += ["--model", args.model]
    return FleetSpec(host=HOST, port=free_port(HOST), dp=dp, worker_args=worker_args, policy=policy,
                     threads_per_worker=max(1, args.threads // dp), grace_s=5.0, log_level="warning")


def start_setups(args: argparse.Namespace, per_worker: int) -> list[Setup]:
    n, threads = args.workers, args.threads
    single = Fleet(fleet_spec(args, 1, "cache_aware", n * per_worker))
    fleet = Fleet(fleet_spec(args, n, "cache_aware", per_worker))
    setups: list[Setup] = []
    try:
        for f in (single, fleet):
            f.start()
        if args.pin:
            print(f"workers pinned to cores {pin_workers(fleet)}", flush=True)
        share = f"{n} workers x {max(1, threads // n)} thread(s)"
        setups = [Setup(f"1 worker x {threads} threads", single.url, single),
                  Setup(f"{share}, cache_aware", fleet.url, fleet),
                  Setup(f"{share}, round_robin", fleet.add_router("round_robin"), fleet)]
        for f in (single, fleet):
            wait_compiled(f.worker_urls)
    except BaseException:
        single.stop()
        fleet.stop()
        raise
    return setups


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default=None)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--kv-cache-tokens", type=int, default=None,
                        help="KV tokens of each of the N workers (the single worker: N times this); "
                             "default: 1/N of the chat workload's working set")
    parser.add_argument("--workers", type=int, default=2, help="N, the workers of the scaled-out fleet")
    parser.add_argument("--programs", type=int, default=16, help="programs per workload (chat: sessions)")
    parser.add_argument("--concurrency", type=int, default=8, help="programs in flight at once")
    parser.add_argument("--threads", type=int, default=2, help="CPU threads of the whole fleet")
    parser.add_argument("--trials", type=int, default=3, help="runs of each workload on each setup")
    parser.add_argument("--workloads", nargs="+", default=[p.name for p in PROGRAMS],
                        choices=[p.name for p in PROGRAMS], metavar="NAME", help="a subset of: %(choices)s")
    parser.add_argument("--eager", action="store_true", help="workers decode eagerly (no background compile)")
    parser.add_argument("--pin", action=argparse.BooleanOptionalAction, default=True,
                        help="each of the N workers (all its threads) on its own core (default: on)")
    parser.add_argument("--host-tier", choices=["off", "default"], default="off",
                        help="the workers' host KV tier: off (the pool is all a worker keeps) or its default size")
    parser.add_argument("--json", default=None, help="also write the results here")
    parser.add_argument("--remote-only", action="store_true",
                        help="only measure remote=True on a worker against per-primitive calls through the router")
    args = parser.parse_args()
    if args.remote_only:
        measure_remote_choice(args)
        return
    working_set = chat_working_set(args.model, CHAT.make_items(args.programs))
    per_worker = args.kv_cache_tokens or working_set // args.workers
    print(f"chat working set {working_set} tokens; KV per worker: 1 worker {args.workers * per_worker}, "
          f"{args.workers} workers {per_worker} each; host tier {args.host_tier}", flush=True)
    setups = start_setups(args, per_worker)
    results: dict[str, dict[str, list[dict[str, Any]]]] = {}
    try:
        programs = [p for p in PROGRAMS if p.name in args.workloads]
        for setup in setups:
            for program in programs:  # warm-up
                run_programs(setup.url, program, program.make_items(2), 2)
        for program in programs:
            items = program.make_items(args.programs)
            for trial in range(args.trials):
                for setup in setups[trial % len(setups):] + setups[:trial % len(setups)]:
                    r = measure(setup, program, items, args.concurrency)
                    results.setdefault(program.name, {}).setdefault(setup.label, []).append(r)
                    print(f"trial {trial + 1}", setup.label, program.name, json.dumps(r), flush=True)
    finally:
        for fleet in {id(s.fleet): s.fleet for s in setups}.values():
            fleet.stop()
    labels = [s.label for s in setups]
    report(results, labels)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"args": vars(args), "chat_working_set_tokens": working_set,
                       "kv_tokens_per_worker": per_worker, "trials": results,
                       "summary": {name: summarize(by_setup, labels) for name, by_setup in results.items()}},
                      f, indent=2)


def summarize(by_setup: dict[str, list[dict[str, Any]]], labels: list[str]) -> dict[str, Any]:
    """A workload's medians over its trials (setup -> metric -> median), and its same-trial ratios."""
    metrics = ["cache_hit_rate", "host_restored_share", "evicted_miss_share", "never_seen_miss_share",
               "programs_per_s", "p50_s", "p99_s", "busiest_worker_share", "worker_cpu_s_per_program",
               "worker_cores"]
    medians = {label: {m: statistics.median(t[m] for t in by_setup[label]) for m in metrics} for label in labels}
    single, aware, rr = (by_setup[label] for label in labels)

    def per_trial(a: list[dict], b: list[dict], metric: str) -> list[float]:
        return [x[metric] / max(y[metric], 1e-9) for x, y in zip(a, b)]

    ratios = {"cache_aware / round_robin programs/s": per_trial(aware, rr, "programs_per_s"),
              "round_robin / cache_aware worker CPU s per program": per_trial(rr, aware, "worker_cpu_s_per_program"),
              "cache_aware / round_robin worker cores": per_trial(aware, rr, "worker_cores"),
              "cache_aware hit rate / single's": per_trial(aware, single, "cache_hit_rate"),
              "round_robin hit rate / single's": per_trial(rr, single, "cache_hit_rate"),
              "N workers (cache_aware) / 1 programs/s": per_trial(aware, single, "programs_per_s")}
    if single[0]["turn_tokens"]:
        rate = single[0]["cache_hit_rate"]
        ratios |= {f"round_robin hit rate / single's, modelled for {n} workers with nothing evicted":
                   [round_robin_model(single[0]["turn_tokens"], n) / rate] for n in (2, 3, 4)}
    return {"medians": medians, "ratios": ratios}


def round_robin_model(single_turns: list[tuple[int, int]], workers: int) -> float:
    """The hit rate of round robin over `workers` workers if nothing were evicted: each turn of a session
    lands on a worker at random (1/workers each), which holds the conversation as of the session's last
    turn there, or only the prefix all sessions share (system prompt, chat template) if it had none. From
    the single worker's (prompt, cached) tokens per turn: its turn k found the conversation through turn
    k-1 cached (its turn 0, the shared prefix)."""
    p = 1 / workers
    history = [cached for _, cached in single_turns]  # history[k]: the conversation through turn k-1
    cached = 0.0
    for k in range(len(history)):
        last_visit = sum(p * (1 - p) ** (k - 1 - j) * history[j + 1] for j in range(k))  # turn j < k
        cached += last_visit + (1 - p) ** k * history[0]
    return cached / sum(prompt for prompt, _ in single_turns)


def report(results: dict[str, dict[str, list[dict[str, Any]]]], labels: list[str]) -> None:
    print("\nEvery trial; the machine's cores are shared with other work, so compare same-trial ratios.")
    print(f"{'workload':<18}{'setup':<44}{'trial':>6}{'hit':>7}{'host':>6}{'evict':>6}{'never':>6}{'prog/s':>8}"
          f"{'p50 s':>8}{'p99 s':>8}{'busiest':>8}{'cpu s/prog':>11}{'cores':>6}{'load':>11}  turn hit rates")
    for name, by_setup in results.items():
        for label in labels:
            for i, r in enumerate(by_setup[label]):
                turns = " ".join(f"{h:.2f}" for h in r["turn_hit_rates"])
                print(f"{name:<18}{label:<44}{i + 1:>6}{r['cache_hit_rate']:>7.3f}{r['host_restored_share']:>6.2f}"
                      f"{r['evicted_miss_share']:>6.2f}{r['never_seen_miss_share']:>6.2f}{r['programs_per_s']:>8.3f}"
                      f"{r['p50_s']:>8.1f}{r['p99_s']:>8.1f}{r['busiest_worker_share']:>8.2f}"
                      f"{r['worker_cpu_s_per_program']:>11.2f}{r['worker_cores']:>6.2f}"
                      f"{r['load_avg_1min'][0]:>5.1f}-{r['load_avg_1min'][1]:<5.1f}"
                      f"  {turns}")
        summary = summarize(by_setup, labels)
        for ratio, values in summary["ratios"].items():
            print(f"{'':<18}{ratio}: median {statistics.median(values):.2f}x, trials "
                  + ", ".join(f"{v:.2f}" for v in values))


if __name__ == "__main__":
    main()
