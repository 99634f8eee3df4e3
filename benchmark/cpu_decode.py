"""CPU decode speed of SmolLM2-135M in each precision mode against HF transformers (fp32, batched) and,
if `llama_cpp` imports, llama.cpp on the same GGUF; every figure is measured in this run, the systems
interleaved round by round (the best round counts), so machine load hits them alike.

Each engine's start is timed, and then its first request, one token of the batch-1 prompt (the time to
first token a user sees after the engine is up, with compile_layers="auto"'s background compile running).
Workloads: batch 1 (one prompt x 64 tokens), 16 x 64 (16 prompts x 64 tokens, batched), few-shot (32
questions after a shared 8-shot prefix x 8 tokens). Prints tok/s (few-shot: seconds) and the ratios the
goals name, then each low-bit mode's fidelity: greedy agreement with the fp32 engine on the 20 reference
prompts (and with transformers' recorded ids), and the perplexity of a fixed text against fp32's.

--compile MODE[,MODE] adds, for each mode named, an engine with compile_layers=True (the decode forward
torch.compile'd); each of its graphs compiles in a warm-up pass over every workload, before the timed rounds.

HF transformers needs `accelerate` to read a GGUF (pip install -e ".[test,bench]"); llama.cpp is optional
(CMAKE_ARGS="-DGGML_NATIVE=ON -DGGML_AMX=OFF" pip install --no-binary llama-cpp-python llama-cpp-python builds it
for this CPU, AMX off: its tile instructions fault on these VMs). On a CPU with AMX, GGML_NATIVE=ON still
compiles ggml's AMX_INT8 path in (-march=native defines __AMX_INT8__; the first token then segfaults): name the
features instead, -DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON
-DGGML_AVX_VNNI=ON -DGGML_AVX512=ON -DGGML_AVX512_VBMI=ON -DGGML_AVX512_VNNI=ON -DGGML_AVX512_BF16=ON
-DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF. Either peer missing is reported and skipped.
Leave OMP_WAIT_POLICY unset unless other processes hold the cores (at load 15 on 2 cores llama.cpp's spinning
threads took ~1.4 s a token instead of ~0.03 s): `passive` makes every OpenMP region (each torch op, each llama.cpp
graph node) wait for a sleeping worker, and on an idle 2-core Xeon VM it cut llama.cpp from 82-91 to 26.6 tok/s at
batch 1 and slowed radixlang's compiled 16-row step from 69 to 77 ms (2026-12-03; figures measured under it
understate llama.cpp). All systems share torch's libgomp in this process; runtime/openmp_workers.py keeps an idle
engine's OpenMP workers from throttling the peer measured beside it, and the peers' from throttling the engine.

With compile_layers="auto" an engine compiles its decode forward in the background where the compile
cache is warm (after a `radixlang serve` or a --compile run on this machine); the timed rounds wait for it.
"""
from __future__ import annotations

import argparse
import time
from typing import Callable

import torch

from radixlang.benchmark.fidelity import agreement, perplexity, reference_run
from radixlang.benchmark.hf_baseline import load_causal_lm
from radixlang.benchmark.radix_cache import DECODE_PROMPTS, few_shot_prompts  # the cache benchmark's workloads
from radixlang.benchmark.results import save
from radixlang.kernels.cpu import block_kernel
from radixlang.runtime.engine import Engine
from radixlang.runtime.models.linear.cpu_paths import dense_min_rows
from radixlang.runtime.models.linear.cpu_paths import detect as detect_cpu_paths
from radixlang.runtime.models.loading.loader import default_model_path

MODES = ("none", "auto", "int8", "int4")
GREEDY = {"temperature": 0, "ignore_eos": True}
WORKLOADS = {"batch 1": (DECODE_PROMPTS[:1], 64), "16 x 64": (DECODE_PROMPTS, 64), "few-shot": (few_shot_prompts(), 8)}
Runner = Callable[[list[str], int], int]  # (prompts, new tokens) -> tokens generated


def engine_runner(engine: Engine) -> Runner:
    def run(prompts: list[str], new_tokens: int) -> int:
        engine.flush_cache()
        outs = engine.generate(prompts, {**GREEDY, "max_new_tokens": new_tokens})
        return sum(o.meta.completion_tokens for o in outs)
    return run


def transformers_runner(tokenizer) -> Runner | None:
    try:
        model = load_causal_lm(default_model_path())
    except ImportError as e:
        print(f"skip HF transformers: {e}")
        return None

    @torch.no_grad()
    def run(prompts: list[str], new_tokens: int) -> int:
        ids = [tokenizer.encode(p) for p in prompts]
        width = max(len(i) for i in ids)
        pad = tokenizer.eos_token_ids[0]
        batch = torch.tensor([[pad] * (width - len(i)) + i for i in ids])  # left-padded, one batch
        mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
        out = model.generate(batch, attention_mask=mask, max_new_tokens=new_tokens, min_new_tokens=new_tokens,
                             do_sample=False, pad_token_id=pad)
        return (out.shape[1] - width) * len(prompts)
    return run


def llama_cpp_runner() -> Runner | None:
    try:
        from llama_cpp import Llama
    except ImportError:
        print("skip llama.cpp: `import llama_cpp` failed (pip install llama-cpp-python to compare against it)")
        return None
    llm = Llama(model_path=str(default_model_path()), n_ctx=2048, n_threads=torch.get_num_threads(),
                verbose=False)  # as many threads as torch runs radixlang and transformers with

    def run(prompts: list[str], new_tokens: int) -> int:  # one prompt at a time: llama.cpp's Python API
        return sum(llm(p, max_tokens=new_tokens, temperature=0.0)["usage"]["completion_tokens"] for p in prompts)
    return run


def first_token_seconds(engine: Engine) -> float:
    """Seconds from a fresh engine's start to its first request's first token (the batch-1 prompt), as a
    user measures it. compile_layers="auto"'s background compile, if any, starts only once the engine has been
    idle for a second; an earlier engine's compile of this run may be running (the line printed says so)."""
    t0 = time.perf_counter()
    engine.generate(DECODE_PROMPTS[0], {**GREEDY, "max_new_tokens": 1})  # done at its first token
    return time.perf_counter() - t0


def compile_graphs(name: str, run: Runner) -> None:
    """Runs every workload once, so that each decode graph (batch 1, padded batches) compiles untimed."""
    t0 = time.perf_counter()
    for prompts, _ in WORKLOADS.values():
        run(prompts, 4)
    print(f"radixlang {name}: compiled its decode graphs in {time.perf_counter() - t0:.0f} s")


def wait_for_background_compiles(engines: dict[str, Engine]) -> None:
    """Defaults compile in the background where the compile cache is warm (compile_layers="auto"): the
    timed rounds start once each such compile is done, so they time the steady state a server reaches."""
    for name, engine in engines.items():
        compiling = engine.decode_compile
        if compiling is None:
            print(f"radixlang {name}: eager (compile_layers=auto compiles once the compile cache is warm)")
            continue
        t0 = time.perf_counter()
        compiling.finished.wait()
        state = "compiled" if compiling.ready else f"compile failed ({compiling.error}), eager"
        print(f"radixlang {name}: {state} in the background, waited {time.perf_counter() - t0:.0f} s")


def measure(runners: dict[str, Runner], repeats: int) -> dict[str, dict[str, tuple[float, int]]]:
    """Best (seconds, tokens) per system and workload, the systems interleaved within each round."""
    best: dict[str, dict[str, tuple[float, int]]] = {name: {} for name in runners}
    for _ in range(repeats):
        for workload, (prompts, new_tokens) in WORKLOADS.items():
            for name, run in runners.items():
                t0 = time.perf_counter()
                tokens = run(prompts, new_tokens)
                elapsed = time.perf_counter() - t0
                if workload not in best[name] or elapsed < best[name][workload][0]:
                    best[name][workload] = (elapsed, tokens)
    return best


def report_speed(best: dict[str, dict[str, tuple[float, int]]]) -> None:
    print(f"\n{'system':24}" + "".join(f"{w:>16}" for w in WORKLOADS))
    for name, results in best.items():
        cells = [f"{results[w][0]:14.2f} s" if w == "few-shot" else f"{results[w][1] / results[w][0]:10.1f} tok/s"
                 for w in WORKLOADS]
        print(f"{name:24}" + "".join(f"{c:>16}" for c in cells))
    for peer in ("transformers", "llama.cpp"):
        if peer not in best:
            continue
        print(f"\nspeed vs {peer} (x, higher is faster)")
        for name in (n for n in best if n.startswith("radixlang")):
            ratios = [best[peer][w][0] / best[peer][w][1] * best[name][w][1] / best[name][w][0] for w in WORKLOADS]
            print(f"  {name:24}" + "".join(f"{w} {r:5.2f}x   " for w, r in zip(WORKLOADS, ratios)))


def report_fidelity(engines: dict[str, Engine]) -> None:
    runs = {mode: reference_run(engine) for mode, engine in engines.items()}
    ppl = {mode: perplexity(engine) for mode, engine in engines.items()}
    print("\nfidelity on the 20 reference prompts and the fixed text")
    for mode, run in runs.items():
        vs_fp32 = "" if mode == "none" or "none" not in runs else "; " + agreement(run, runs["none"])
        delta = f" ({ppl[mode] - ppl['none']:+.3f})" if "none" in ppl else ""
        print(f"  {mode:12} equal to transformers' ids on {run.equal_to_transformers()}/20; "
              f"perplexity {ppl[mode]:.3f}{delta}{vs_fp32}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=2, help="rounds; each system's best round counts")
    parser.add_argument("--modes", default="auto,none",
                        help=f"radixlang quantization modes, comma-separated, of {','.join(MODES)} (default: the "
                             "default, auto, and the exact none)")
    parser.add_argument("--compile", default="", help="modes to run also with compile_layers=True, comma-separated")
    parser.add_argument("--no-peers", action="store_true", help="skip HF transformers and llama.cpp")
    parser.add_argument("--publish", action="store_true",
                        help="also write docs/results/cpu_decode.json, the figures the docs render (make results)")
    args = parser.parse_args()
    modes = [m for m in args.modes.split(",") if m]
    if block_kernel.available(wait=True):  # built here if missing, before any timing (make install builds it)
        paths = (f"cpu {detect_cpu_paths().capability}: block_mm kernel (int8 activations) at every row count "
                 "(batch-invariant")
    else:
        paths = (f"{detect_cpu_paths().describe()} from {dense_min_rows(1)} rows (Q8_0 layers: {dense_min_rows(2)}")
    print(f"{paths}; measured once on this machine, cached); torch {torch.__version__}, "
          f"{torch.get_num_threads()} threads")
    engines, first_tokens = {}, {}
    for m in modes:
        others = [e.decode_compile for e in engines.values() if e.decode_compile is not None]
        t0 = time.perf_counter()
        engines[m] = Engine(device="cpu", kv_cache_tokens=16384, quantization=m)
        up = time.perf_counter() - t0
        first_tokens[m] = first_token_seconds(engines[m])
        beside = " (another engine's compile running beside it)" if any(
            c.thread.is_alive() and not c.finished.is_set() for c in others) else ""
        print(f"radixlang {m}: engine up in {up:.2f} s; first token of its first request {first_tokens[m]:.3f} s "
              f"later{beside}")
    for m in (m for m in args.compile.split(",") if m):
        engines[f"{m}+compile"] = Engine(device="cpu", kv_cache_tokens=16384, quantization=m, compile_layers=True)
    try:
        runners: dict[str, Runner] = {f"radixlang {m}": engine_runner(e) for m, e in engines.items()}
        wait_for_background_compiles(engines)
        for name, engine in engines.items():
            if name.endswith("+compile"):
                compile_graphs(name, engine_runner(engine))
        if not args.no_peers:
            peers = {"transformers": transformers_runner(next(iter(engines.values())).tokenizer),
                     "llama.cpp": llama_cpp_runner()}
            runners |= {name: run for name, run in peers.items() if run is not None}
        for run in runners.values():
            run(DECODE_PROMPTS[:2], 4)  # warm-up
        best = measure(runners, args.repeats)
        report_speed(best)
        figures = {"workloads": list(WORKLOADS), "paths": paths, "first_token_s": first_tokens,
                   "systems": {name: {w: {"seconds": s, "tokens": t, "tok_s": t / s} for w, (s, t) in cells.items()}
                               for name, cells in best.items()}}
        print(f"saved {save('cpu_decode', figures, publish=args.publish)}")
        report_fidelity(engines)
        for engine in engines.values():
            engine.check_invariants()
    finally:
        for engine in engines.values():
            engine.shutdown()
    print("\n(one run on a shared machine: compare the ratios, not the absolute figures)")


if __name__ == "__main__":
    main()
