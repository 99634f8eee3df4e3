"""Quantization methods on SmolLM2-135M, one run: perplexity (the engine's input logprobs) of held-out
texts, greedy agreement with fp32 on fidelity.py's 20 prompts, the time each folder took to quantize, then
(with --speed) decode tok/s (batch 1, 16 x 64) and prefill tok/s, for: fp32, RTN int4 g128, GPTQ int4
g128 and g32 (the defaults: asymmetric calibration 0.5, act-order, percdamp 0.1, clip search), AWQ int4 g128, naive W8A8 (RTN),
SmoothQuant W8A8 (the default: alpha searched per layer, down_proj's input Hadamard-rotated at run time; a
global alpha sweep with --alphas), it without the rotation (--no-rotate-down) and with alpha 0.5 for every
layer, and the GGUF's own Q4_1 / Q8_0 blocks (`auto`).

Held-out text: fidelity.py's LONG_TEXT (~1.2k tokens of encyclopedic prose) and STORY_TEXT (~900 tokens:
a story with dialogue, a letter, a notice), both written for the benchmark and unlike the calibration
sources (tests/runtime/quantize/test_corpus.py checks they share no 8-word run with any corpus). Choices
(defaults, options) are made on a third text, quantization_dev.txt, never on these two.

Every quantized model is made here by `radixlang quantize`'s code from the same fp32 weights (the GGUF
dequantized), calibrated on the default text (GPTQ: `prose`, the others: `builtin`; runtime/quantize/
corpus.py), and loaded from the HF folder it writes, as a user would. --reuse DIR keeps the folders there and skips those already written
(then no quantization time is printed for them).

Speed: the engines run the same workloads interleaved round by round, the best round counts (machine
load hits them alike); ratios are against fp32 and against `auto`.
"""
from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

from radixlang.runtime.engine import Engine
from radixlang.runtime.quantize.driver import QuantizeOptions, quantize

sys.path.insert(0, str(Path(__file__).resolve().parent))
from cpu_decode import engine_runner  # noqa: E402
from fidelity import FIXED_TEXT, LONG_TEXT, STORY_TEXT, agreement, perplexity, reference_run  # noqa: E402
from radix_cache import DECODE_PROMPTS  # noqa: E402

GREEDY = {"temperature": 0, "ignore_eos": True}
FOLDERS = {  # name: the quantize options that make it
    "RTN int4 g128": QuantizeOptions(method="rtn", bits=4, group_size=128),
    "GPTQ int4 g128": QuantizeOptions(method="gptq", bits=4, group_size=128),
    "GPTQ int4 g32": QuantizeOptions(method="gptq", bits=4, group_size=32),
    "AWQ int4 g128": QuantizeOptions(method="awq", bits=4, group_size=128),
    "RTN W8A8": QuantizeOptions(method="smoothquant", smooth=False, rotate_down=False),
    "SmoothQuant W8A8": QuantizeOptions(method="smoothquant"),
    "SmoothQuant W8A8 unrotated": QuantizeOptions(method="smoothquant", rotate_down=False),
    "SmoothQuant W8A8 alpha 0.5": QuantizeOptions(method="smoothquant", alpha=0.5),
}
BASELINES = {"GPTQ int4 g128": "RTN int4 g128", "GPTQ int4 g32": "RTN int4 g128", "AWQ int4 g128": "RTN int4 g128",
             "SmoothQuant W8A8": "RTN W8A8", "SmoothQuant W8A8 unrotated": "RTN W8A8",
             "SmoothQuant W8A8 alpha 0.5": "RTN W8A8"}  # the gap each method is judged to close
TEXTS = {"long text": LONG_TEXT, "story text": STORY_TEXT}
PREFILL_PROMPTS = [f"{FIXED_TEXT} ({i})" for i in range(8)]  # ~250 tokens each, distinct (no cache hits)
Runner = Callable[[], tuple[float, int]]  # -> (seconds, tokens)


def make_folders(root: Path, names: list[str]) -> dict[str, Path]:
    folders = {}
    for name in names:
        path = root / name.replace(" ", "_")
        if not (path / "config.json").exists():
            t0 = time.perf_counter()
            quantize(None, path, FOLDERS[name])
            print(f"{name}: quantized in {time.perf_counter() - t0:.0f} s wall (load average after: "
                  f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs)", flush=True)
        folders[name] = path
    return folders


def workloads(engine: Engine) -> dict[str, Runner]:
    decode = engine_runner(engine)

    def timed(prompts: list[str], new_tokens: int) -> tuple[float, int]:
        t0 = time.perf_counter()
        tokens = decode(prompts, new_tokens)
        return time.perf_counter() - t0, tokens

    def prefill() -> tuple[float, int]:
        engine.flush_cache()
        t0 = time.perf_counter()
        outs = engine.generate(PREFILL_PROMPTS, {**GREEDY, "max_new_tokens": 1})
        return time.perf_counter() - t0, sum(o.meta.prompt_tokens for o in outs)

    return {"decode b1": lambda: timed(DECODE_PROMPTS[:1], 64), "decode 16x64": lambda: timed(DECODE_PROMPTS, 64),
            "prefill": prefill}


def measure(engines: dict[str, Engine], repeats: int) -> dict[str, dict[str, float]]:
    """Best tok/s per engine and workload, the engines interleaved within each round."""
    runs = {name: workloads(e) for name, e in engines.items()}
    best: dict[str, dict[str, float]] = {name: {} for name in engines}
    for _ in range(repeats):
        for workload in ("decode b1", "decode 16x64", "prefill"):
            for name, w in runs.items():
                seconds, tokens = w[workload]()
                best[name][workload] = max(best[name].get(workload, 0.0), tokens / seconds)
    return best


def report_fidelity(engines: dict[str, Engine]) -> None:
    fp32_run = reference_run(engines["fp32"])
    ppl = {text: {name: perplexity(e, body) for name, e in engines.items()} for text, body in TEXTS.items()}
    print("\nfidelity: perplexity of held-out text (fidelity.py's LONG_TEXT, ~1.2k tokens, and STORY_TEXT,"
          " ~900 tokens; change from fp32), greedy agreement with fp32")
    for name, engine in engines.items():
        vs = "" if name == "fp32" else "; " + agreement(reference_run(engine), fp32_run)
        scores = "  ".join(f"{ppl[t][name]:.3f} ({100 * (ppl[t][name] / ppl[t]['fp32'] - 1):+.1f}%)" for t in TEXTS)
        print(f"  {name:26} ppl {scores}{vs}", flush=True)
    for a, b in BASELINES.items():
        if a in engines and b in engines:
            closed = [100 * (1 - (p[a] - p["fp32"]) / (p[b] - p["fp32"])) for p in ppl.values()]
            print(f"  {a} closes {closed[0]:.0f}% (long text) / {closed[1]:.0f}% (story text) of {b}'s gap to fp32")


def report_speed(speed: dict[str, dict[str, float]]) -> None:
    print(f"\n{'tok/s':26}" + "".join(f"{w:>14}" for w in ("decode b1", "decode 16x64", "prefill")))
    for name, row in speed.items():
        ratios = " ".join(f"{row[w] / speed['fp32'][w]:.2f}x" for w in row)
        vs_auto = " ".join(f"{row[w] / speed['auto'][w]:.2f}x" for w in row) if "auto" in speed else "-"
        print(f"{name:26}" + "".join(f"{row[w]:14.1f}" for w in row) + f"   vs fp32 {ratios}   vs auto {vs_auto}")


def sweep_alpha(root: Path, alphas: list[float]) -> None:
    print("\nSmoothQuant alpha sweep, one alpha for every layer")
    for alpha in alphas:
        path = quantize(None, root / f"sq_alpha_{alpha}", QuantizeOptions(method="smoothquant", alpha=alpha))
        with Engine(str(path), device="cpu", kv_cache_tokens=4096) as engine:
            print(f"  alpha {alpha}: ppl {perplexity(engine, LONG_TEXT):.3f} (long text)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--speed", action="store_true", help="also measure decode and prefill speed")
    parser.add_argument("--repeats", type=int, default=1, help="speed rounds; each engine's best counts")
    parser.add_argument("--reuse", default=None, help="folder to keep the quantized models in (and reuse)")
    parser.add_argument("--only", default=",".join(FOLDERS), help="quantized models to run, comma-separated")
    parser.add_argument("--alphas", default="", help="SmoothQuant alphas to sweep (perplexity), comma-separated")
    args = parser.parse_args()
    root = Path(args.reuse) if args.reuse else Path(tempfile.mkdtemp(prefix="radixlang-quant-"))
    folders = make_folders(root, [n for n in args.only.split(",") if n])
    # fp32 is quantization="none": the default ("auto") runs the GGUF's Q4_1 / Q8_0 blocks and bf16 copies
    engines = {name: Engine(device="cpu", kv_cache_tokens=4096, quantization=mode)
               for name, mode in (("fp32", "none"), ("auto", "auto"))}
    engines |= {name: Engine(str(path), device="cpu", kv_cache_tokens=4096) for name, path in folders.items()}
    try:
        for engine in engines.values():
            engine.generate(DECODE_PROMPTS[:2], {**GREEDY, "max_new_tokens": 4})  # warm-up
        report_fidelity(engines)
        if args.speed:
            report_speed(measure(engines, args.repeats))
        for engine in engines.values():
            engine.check_invariants()
    finally:
        for engine in engines.values():
            engine.shutdown()
    if args.alphas:
        sweep_alpha(root, [float(a) for a in args.alphas.split(",")])
    print("\n(one run on a 2-core machine shared with other sessions: compare ratios, not absolute figures)")


if __name__ == "__main__":
    main()
