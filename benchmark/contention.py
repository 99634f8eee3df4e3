"""Contention: the default model's greedy chat answers with and without a CPU-bound competitor on every core, for
the defaults (runtime/openmp_policy.py chooses the OpenMP wait policy from the machine's state), for
OMP_WAIT_POLICY=passive, and for the policy turned off (libgomp's spinning, the defaults before issue 43). Each
variant is a fresh process (libgomp reads its settings once); it times the generation, not the model's load. The
competitors are busy loops, one process per CPU of the affinity mask. The machine's 1-minute load average before
each run is printed: on a shared machine "no competitor" is not idle.

    python benchmark/contention.py [--tokens 48] [--rounds 1] [--variants default passive spin]
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import subprocess
import sys
import time

WORKLOAD = """
import json, time
import radixlang.runtime as rt
from radixlang.runtime.engine import Engine
with Engine(compile_layers=False) as engine:
    prompts = [engine.tokenizer.apply_chat_template([{"role": "user", "content": q}])
               for q in ("What is the capital of France?", "Why is the sea salty?")]
    engine.generate(prompts[0], {"max_new_tokens": 2, "temperature": 0})  # warm
    t0 = time.perf_counter()
    for p in prompts:
        engine.generate(p, {"max_new_tokens": TOKENS, "temperature": 0, "ignore_eos": True})
    print(json.dumps({"s": time.perf_counter() - t0, "policy": rt.OPENMP_POLICY and rt.OPENMP_POLICY.reason}))
"""
VARIANTS = {"default": {}, "passive": {"OMP_WAIT_POLICY": "passive"}, "spin": {"RADIXLANG_OPENMP_POLICY": "off"}}


def spin() -> None:
    while True:
        pass


def run(tokens: int, extra: dict[str, str]) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT", "OMP_NUM_THREADS")}
    out = subprocess.run([sys.executable, "-c", WORKLOAD.replace("TOKENS", str(tokens))], env=env | extra,
                         capture_output=True, text=True, timeout=1800, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokens", type=int, default=48)
    ap.add_argument("--rounds", type=int, default=1)
    ap.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS),
                    help="spin: the policy off (libgomp's spinning, the defaults before issue 43)")
    args = ap.parse_args()
    cpus = len(os.sched_getaffinity(0))
    print(f"{cpus} CPUs; 2 chat answers of {args.tokens} greedy tokens, SmolLM2 default mode, eager decode")
    for competitor in (False, True):
        procs = [multiprocessing.Process(target=spin, daemon=True) for _ in range(cpus if competitor else 0)]
        for p in procs:
            p.start()
        time.sleep(2 if competitor else 0)
        try:
            for _ in range(args.rounds):
                for name in args.variants:
                    extra = VARIANTS[name]
                    load = os.getloadavg()[0]
                    result = run(args.tokens, extra)
                    print(f"competitor {'yes' if competitor else 'no ':>3}  {name:>8}: {result['s']:7.2f} s  "
                          f"(load before {load:.1f}; policy: {result['policy']})", flush=True)
        finally:
            for p in procs:
                p.terminate()


if __name__ == "__main__":
    main()
