"""Program-level benchmark: SGLang-paper workloads as radixlang programs against the systems a user would
pick instead, all measured in this run (interleaved: each workload runs every system back to back).

Systems: radixlang (radix cache on), radixlang with the radix cache off, HF transformers `generate` on
the same weights (fp32, batched, control flow in plain Python), llama.cpp (llama-cpp-python, when
installed). Data is generated in code; nothing is downloaded.

    .venv/bin/python -m benchmark.programs            # the full suite (a few minutes on 2 cores)
    .venv/bin/python -m benchmark.programs --quick    # a smaller set

Writes results.json, results.md (absolute numbers), results_relative.md (ratios only) and results.png
(needs the `bench` extra: matplotlib) to --out, and prints the tables.
"""
from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
from pathlib import Path

from tqdm import tqdm

import radixlang as rl

from . import few_shot, hellaswag, json_extraction, multi_turn, react, remote, skeleton_of_thought, tree_of_thought
from .measure import Variant, Workload, measure
from .report import markdown, plot, workload_result
from .systems import RADIXLANG, RADIXLANG_NO_CACHE, Systems, start_systems, warm_up

WORKLOADS = [few_shot.WORKLOAD, hellaswag.WORKLOAD, tree_of_thought.WORKLOAD, skeleton_of_thought.WORKLOAD,
             react.WORKLOAD, json_extraction.WORKLOAD, multi_turn.SHORT, multi_turn.LONG, remote.WORKLOAD]
FULL_ITEMS = {"few-shot QA": 16, "HellaSwag select": 16, "tree of thought": 3, "skeleton of thought": 3,
              "ReAct agent": 6, "JSON extraction": 6, "chat, short turns": 4, "chat, long turns": 3,
              "remote program": 3}
QUICK_ITEMS = 2
DEFAULT_ENGINES = (RADIXLANG, RADIXLANG_NO_CACHE)  # a workload may add its own (jump-forward off)
DEFAULT_OUT = Path(__file__).resolve().parents[1] / "results" / "programs"


def default_variants(systems: Systems, workload: Workload, items: list) -> list[Variant]:
    variants = [Variant(label, lambda e=engine: workload.run_radixlang(rl.EngineBackend(e), items), engine=engine)
                for label, engine in systems.engines.items() if label in DEFAULT_ENGINES]
    if workload.run_plain is not None:
        variants += [Variant(lm.label, lambda lm=lm: workload.run_plain(lm, items), lm=lm) for lm in systems.plain]
    return variants


Planned = list[tuple[Workload, list, list[Variant]]]  # each workload with its items and the systems to run


def plan(systems: Systems, workloads: list[Workload], sizes: dict[str, int]) -> Planned:
    planned = []
    for workload in workloads:
        items = workload.make_items(sizes[workload.name])
        variants = default_variants(systems, workload, items)
        if workload.variants is not None:
            variants = workload.variants(systems, items, variants)
        planned.append((workload, items, variants))
    return planned


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help=f"{QUICK_ITEMS} programs per workload")
    parser.add_argument("--model", help="a .gguf file or an HF folder (default: SmolLM2-135M-Instruct's GGUF)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"results folder (default {DEFAULT_OUT})")
    parser.add_argument("--workloads", nargs="+", choices=[w.name for w in WORKLOADS], metavar="NAME",
                        help="run only these workloads (default: all)")
    parser.add_argument("--baselines", nargs="*", default=["hf", "llama.cpp"], choices=["hf", "llama.cpp"],
                        help="plain-LM baselines to try (default: both; a missing one is skipped)")
    parser.add_argument("--batch-size", type=int, default=16, help="HF transformers batch size")
    parser.add_argument("--kv-cache-tokens", type=int, default=16384)
    parser.add_argument("--device", default="cpu")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> dict:
    args = parse_args(argv)
    workloads = [w for w in WORKLOADS if not args.workloads or w.name in args.workloads]
    sizes = {w.name: QUICK_ITEMS if args.quick else FULL_ITEMS[w.name] for w in workloads}
    systems = start_systems(args.model, args.device, args.kv_cache_tokens, args.batch_size, args.baselines)
    try:
        for name, why in systems.skipped.items():
            print(f"skipping {name}: {why}", file=sys.stderr)
        planned = plan(systems, workloads, sizes)  # starts what a workload adds (an engine, a server)
        warm_up(systems)
        results = []
        with tqdm(total=sum(len(v) for _, _, v in planned), desc="benchmark", file=sys.stderr) as bar:
            for workload, items, variants in planned:
                measured = []
                for variant in variants:
                    bar.set_postfix_str(f"{workload.name}: {variant.label}")
                    measured.append(measure(variant, workload, items))
                    bar.update()
                results.append(workload_result(workload, measured))
    finally:
        systems.close()
    document = {
        "command": " ".join(["python -m benchmark.programs", *(sys.argv[1:] if argv is None else argv)]),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": {"platform": platform.platform(), "processor": platform.processor(), "cpus": os.cpu_count(),
                    "python": platform.python_version(), "device": args.device},
        "model": systems.model, "quick": args.quick, "skipped": systems.skipped, "workloads": results,
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(document, indent=1))
    (args.out / "results.md").write_text(markdown(results, relative=False))
    (args.out / "results_relative.md").write_text(markdown(results, relative=True))
    print(markdown(results, relative=False))
    skipped_plot = plot(results, args.out / "results.png")
    print(skipped_plot or f"chart: {args.out / 'results.png'}")
    print(f"results: {args.out / 'results.json'}")
    return document
