"""The GPU path against HF transformers on the same GPU and the same weights, in one run; prints one JSON table.

Measures (issue 12): decode tok/s at batch 1/16/64/256 against transformers' `generate`; the shared-prefix
workload (64 requests x 32 tokens after a 4k-token prefix) with cascade on (inside the decode graphs) and
off; a kernel microbenchmark (benchmark/gpu_kernels.py: attention, issue 29's MLA latent decode and fused
MoE, issue 30's GPTQ / AWQ dequant-GEMM and W8A8 int8 linear at SmolLM2's and a 7B layer's shapes, the W8A8
one against a bf16 torch.mm and checked bit for bit there); the HBM bandwidth decode
achieves at 64 requests x 4k context (bytes of weights and KV read per step / step time); for those two,
also the decode graphs' replay time alone (CUDA events), which tells the kernels' share from the host's;
Triton vs torch attention (greedy ids in fp32, top-1 logprobs in bf16); and decode with CUDA graphs on vs
off. `goals` holds the issue's targets as booleans.

On an H200 (its image has torch, triton, transformers and tokenizers; the engine imports neither gguf, lark,
fastapi nor uvicorn on this path, so no wheels are needed). `../shared` does not travel, so first, here:
    mkdir -p .gpu && cp -r /work/shared/gpu/. .gpu/ && echo /.gpu/ >> .git/info/exclude
then one device run with carry [".gpu"]:
    python3 .gpu/make_random_model.py /tmp/smol && \\
    PYTHONUNBUFFERED=1 python3 benchmark/gpu.py --model /tmp/smol --out $OUT/gpu.json
(add `--scale S` to make_random_model.py for sharper random logits if the agreement checks hit near-ties).
The script makes `radixlang` importable from this checkout by itself (a symlink in a temp folder).

`--quick` runs every part at tiny sizes on the CPU (torch, and Triton under TRITON_INTERPRET=1; decode
graphs become the same padded path run eagerly): a smoke test of the script, its numbers mean nothing.
"""
from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import tempfile
import time
import traceback
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from statistics import median
from typing import Any, Callable, Iterator

HERE = Path(__file__).resolve().parent
H200_PEAK_TB_S = 4.8  # the datasheet's HBM3e bandwidth
LOGPROB_TOL = {"bfloat16": 0.1, "float32": 1e-3}  # |top-1 logprob, Triton - torch| (bf16 keeps ~3 digits)
GOALS = {"batch1_vs_hf": 20.0, "batch256_vs_hf": 5.0, "cascade_vs_no_cascade": 3.0, "decode_hbm_fraction": 0.6}


@dataclass(frozen=True, slots=True)
class Sizes:
    batches: tuple[int, ...]
    new_tokens: int
    prompt_len: int
    prefix_len: int  # the shared-prefix workload
    prefix_requests: int
    suffix_len: int
    cascade_min: int | None  # None: the engine's CASCADE_MIN_PREFIX
    hbm_requests: int
    hbm_context: int
    hbm_steps: int
    agree_prompts: int  # odd, so graph batches are padded
    agree_tokens: int
    kv_cache_tokens: int
    max_prefill_tokens: int


FULL = Sizes(batches=(1, 16, 64, 256), new_tokens=32, prompt_len=32, prefix_len=4096, prefix_requests=64,
             suffix_len=16, cascade_min=None, hbm_requests=64, hbm_context=4096, hbm_steps=32, agree_prompts=37,
             agree_tokens=32, kv_cache_tokens=320_000, max_prefill_tokens=8192)
QUICK = Sizes(batches=(1, 3), new_tokens=3, prompt_len=6, prefix_len=40, prefix_requests=3, suffix_len=3,
              cascade_min=16, hbm_requests=2, hbm_context=24, hbm_steps=2, agree_prompts=3, agree_tokens=3,
              kv_cache_tokens=2048, max_prefill_tokens=256)


def ensure_importable() -> None:
    """`import radixlang` from this checkout without installing it (the repo root is the package)."""
    try:
        import radixlang  # noqa: F401
    except ImportError:
        link_dir = Path(tempfile.mkdtemp(prefix="radixlang-path-"))
        (link_dir / "radixlang").symlink_to(HERE.parent)
        sys.path.insert(0, str(link_dir))


def kernel_sizes(quick: bool):
    from gpu_kernels import KernelSizes

    if quick:
        return KernelSizes(heads=((9, 3, 64),), decode_requests=(1, 2), decode_contexts=(40,), extend_requests=(1,),
                           extend_contexts=(24,), max_kv_bytes=1 << 30, reference_max_kv_bytes=1 << 30,
                           max_extend_tokens=64, cascade_requests=(2,), cascade_prefixes=(40,), cascade_suffix=3,
                           mla_shapes=((20, 32, 8),), mla_requests=(2,), mla_contexts=(40,),
                           moe_shapes=((48, 40, 5, 2),), moe_tokens=(13,), dequant_shapes=((64, 80, 4, 32),),
                           dequant_rows=(3, 20), w8a8_shapes=((200, 80),), w8a8_rows=(3, 20))
    return KernelSizes(heads=((9, 3, 64), (32, 8, 128)), decode_requests=(1, 16, 64, 256),
                       decode_contexts=(1024, 4096, 16384, 32768), extend_requests=(1, 16),
                       extend_contexts=(1024, 4096, 16384), max_kv_bytes=4 << 30, reference_max_kv_bytes=1 << 30,
                       max_extend_tokens=65536, cascade_requests=(16, 64, 256), cascade_prefixes=(1024, 4096),
                       cascade_suffix=32,
                       # DeepSeek-V3's latent rows with 16 (one rank of TP 8) and 128 query heads
                       mla_shapes=((16, 512, 64), (128, 512, 64)), mla_requests=(1, 64, 256), mla_contexts=(1024, 4096),
                       # Mixtral-8x7B's experts, and 32 of DeepSeek-V3's (one rank of EP 8)
                       moe_shapes=((4096, 14336, 8, 2), (7168, 2048, 32, 8)), moe_tokens=(1, 64, 1024, 8192),
                       # GPTQ / AWQ linears: SmolLM2's gate_up and down, a 7B layer's (Llama-2-7B) q and up / down
                       dequant_shapes=((576, 3072, 4, 64), (1536, 576, 4, 64), (4096, 4096, 4, 128),
                                       (4096, 11008, 4, 128), (11008, 4096, 4, 128), (4096, 11008, 8, 128)),
                       dequant_rows=(1, 16, 256, 2048),
                       # W8A8 linears: SmolLM2's qkv, o, gate_up, down, and Llama-2-7B's
                       w8a8_shapes=((576, 960), (576, 576), (576, 3072), (1536, 576),
                                    (4096, 12288), (4096, 4096), (4096, 22016), (11008, 4096)),
                       w8a8_rows=(1, 16, 256, 2048))


def random_prompts(count: int, length: int, vocab: int, seed: int) -> list[list[int]]:
    import torch

    g = torch.Generator().manual_seed(seed)
    return torch.randint(100, vocab - 100, (count, length), generator=g).tolist()


def greedy(new_tokens: int) -> dict[str, Any]:
    return {"temperature": 0, "max_new_tokens": new_tokens, "ignore_eos": True}


def synchronize(device) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize()


@contextmanager
def runner_set(engine, **attrs: Any) -> Iterator[None]:
    """Sets ModelRunner attributes (graphs=None: eager decode; cascade_min=None: no cascade) while idle."""
    runner = engine.runner
    saved = {k: getattr(runner, k) for k in attrs}
    for k, v in attrs.items():
        setattr(runner, k, v)
    try:
        yield
    finally:
        for k, v in saved.items():
            setattr(runner, k, v)


class TimedReplay:
    """A captured decode graph whose replays are bracketed by CUDA events (read once the run is over)."""

    def __init__(self, graph, pending: list):
        self.graph, self.pending = graph, pending

    def replay(self) -> None:
        import torch

        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        self.graph.replay()
        end.record()
        self.pending.append((start, end))


@contextmanager
def device_step_ms(engine) -> Iterator[list[float]]:
    """Times each decode step the graphs run, in ms: the device's share of a step, without the host work
    around it (scheduling, packing, sampling, streaming). A captured graph is timed by CUDA events around
    its replay; on the CPU, the eager padded forward by the wall clock. The list fills when the block ends."""
    graphs = engine.runner.graphs
    times: list[float] = []
    if graphs is None:
        yield times
        return
    captured, pending = dict(graphs.graphs), []
    graphs.graphs.update({key: (TimedReplay(graph, pending), logits) for key, (graph, logits) in captured.items()})
    eager = graphs._padded_forward

    def timed_eager(b: int, cascade: bool):
        t0 = time.perf_counter()
        out = eager(b, cascade)
        times.append((time.perf_counter() - t0) * 1e3)
        return out

    graphs._padded_forward = timed_eager
    try:
        yield times
    finally:
        graphs.graphs.update(captured)
        del graphs._padded_forward  # the class's method again
        for start, end in pending:
            end.synchronize()
            times.append(start.elapsed_time(end))


def median_step(times: list[float]) -> float | None:
    return median(times) if times else None


def timed_generate(engine, prompts: list[list[int]], new_tokens: int, flush: bool = True) -> float:
    if flush:
        engine.flush_cache()
    t0 = time.perf_counter()
    engine.generate(input_ids=prompts, sampling_params=greedy(new_tokens))
    return time.perf_counter() - t0


# ---- the parts --------------------------------------------------------------------------------------
def throughput(engine, hf, sizes: Sizes, vocab: int, device) -> list[dict]:
    import torch

    rows = []
    for batch in sizes.batches:
        prompts = random_prompts(batch, sizes.prompt_len, vocab, seed=batch)
        tokens = batch * sizes.new_tokens
        ours = tokens / timed_generate(engine, prompts, sizes.new_tokens)
        ids = torch.tensor(prompts, device=device)
        synchronize(device)
        t0 = time.perf_counter()
        hf.generate(input_ids=ids, attention_mask=torch.ones_like(ids), max_new_tokens=sizes.new_tokens,
                    min_new_tokens=sizes.new_tokens, do_sample=False, pad_token_id=0)
        synchronize(device)
        theirs = tokens / (time.perf_counter() - t0)
        rows.append({"batch": batch, "new_tokens": sizes.new_tokens, "radixlang_tok_s": ours, "hf_tok_s": theirs,
                     "ratio": ours / theirs})
    return rows


def cascade_graph_steps(engine) -> int:
    """Decode steps run so far by a cascade variant of the decode graphs (padded, on the CPU)."""
    graphs = engine.runner.graphs
    return 0 if graphs is None else sum(n for (_, cascade), n in graphs.steps.items() if cascade)


def shared_prefix(engine, sizes: Sizes, vocab: int) -> dict:
    """Cascade decode (inside the decode graphs when they are on) against plain decode with graphs on and off."""
    prefix = random_prompts(1, sizes.prefix_len, vocab, seed=7)[0]
    prompts = [prefix + s for s in random_prompts(sizes.prefix_requests, sizes.suffix_len, vocab, seed=8)]
    on = engine.runner.cascade_min if sizes.cascade_min is None else sizes.cascade_min
    seconds, device = {}, {}
    before = cascade_graph_steps(engine)
    for name, attrs in (("cascade", {"cascade_min": on}), ("no_cascade", {"cascade_min": None}),
                        ("no_cascade_no_graphs", {"cascade_min": None, "graphs": None})):
        with runner_set(engine, **attrs), device_step_ms(engine) as times:
            seconds[name] = timed_generate(engine, prompts, sizes.new_tokens)
        if name != "no_cascade_no_graphs":
            device[name] = median_step(times)
    both = device["cascade"] and device["no_cascade"]
    return {"requests": sizes.prefix_requests, "prefix_tokens": sizes.prefix_len, "new_tokens": sizes.new_tokens,
            "seconds": seconds, "cascade_speedup": seconds["no_cascade"] / seconds["cascade"],
            "cascade_speedup_vs_eager": seconds["no_cascade_no_graphs"] / seconds["cascade"],
            "cascade_graph_steps": cascade_graph_steps(engine) - before,
            # the decode graphs alone: what cascade saves on the device, apart from the host work per step
            "device_decode_step_ms": device,
            "device_cascade_speedup": device["no_cascade"] / device["cascade"] if both else None}


def decode_hbm(engine, sizes: Sizes, vocab: int, device) -> dict:
    """Step time from two runs over the same cached prompts, 1 and 1 + hbm_steps new tokens: the
    difference is hbm_steps decode steps. Bytes: every weight once, plus each request's KV."""
    import torch

    prompts = random_prompts(sizes.hbm_requests, sizes.hbm_context, vocab, seed=9)
    engine.flush_cache()
    engine.generate(input_ids=prompts, sampling_params=greedy(1))  # the prompts' KV enters the radix cache
    one = timed_generate(engine, prompts, 1, flush=False)
    with device_step_ms(engine) as times:
        many = timed_generate(engine, prompts, 1 + sizes.hbm_steps, flush=False)
    step = (many - one) / sizes.hbm_steps
    device_step = median_step(times)
    model = engine.runner.model
    cfg = model.config
    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    elsize = torch.empty((), dtype=next(model.parameters()).dtype).element_size()
    kv_per_token = 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * elsize
    mean_kv_len = sizes.hbm_context + 1 + sizes.hbm_steps / 2
    step_bytes = weight_bytes + sizes.hbm_requests * mean_kv_len * kv_per_token
    tb_s = step_bytes / step / 1e12 if step > 0 else None
    device_tb_s = step_bytes / device_step / 1e9 if device_step else None  # device_step is in ms
    on_gpu = device.type == "cuda"
    return {"requests": sizes.hbm_requests, "context": sizes.hbm_context, "step_ms": step * 1e3,
            "bytes_per_step": step_bytes, "weight_bytes": weight_bytes, "tb_s": tb_s,
            "fraction_of_peak": tb_s / H200_PEAK_TB_S if tb_s is not None and on_gpu else None,
            # the decode graph's replay alone: the kernels' bandwidth, apart from the host work per step
            "device_step_ms": device_step, "device_tb_s": device_tb_s,
            "device_fraction_of_peak": device_tb_s / H200_PEAK_TB_S if device_tb_s is not None and on_gpu else None}


def run_ids(engine, prompts: list[list[int]], new_tokens: int, logprobs: bool = False):
    outs = engine.generate(input_ids=prompts, sampling_params=greedy(new_tokens), return_logprob=logprobs,
                           top_logprobs_num=1 if logprobs else 0)
    return outs


def agreement(a: list[list[int]], b: list[list[int]]) -> dict:
    equal = sum(x == y for x, y in zip(a, b))
    return {"prompts": len(a), "equal": equal, "fraction": equal / len(a)}


def top1_logprob_gap(a, b, dtype: str) -> dict:
    """Over each prompt's positions up to its first differing token (the contexts are the same there)."""
    diffs = []
    for x, y in zip(a, b):
        for tx, ty, lx, ly in zip(x.output_ids, y.output_ids, x.meta.output_logprobs, y.meta.output_logprobs):
            diffs.append(abs(lx.top[0][1] - ly.top[0][1]))
            if tx != ty:
                break
    worst = max(diffs)
    return {"positions": len(diffs), "max_abs_diff": worst, "mean_abs_diff": sum(diffs) / len(diffs),
            "tolerance": LOGPROB_TOL[dtype], "ok": worst <= LOGPROB_TOL[dtype]}


def graphs_on_off(engine, prompts: list[list[int]], n: int):
    """(eager outputs, graph outputs) of one engine: the same prompts with its decode graphs off, then on."""
    with runner_set(engine, graphs=None):
        eager = run_ids(engine, prompts, n, logprobs=True)
    return eager, run_ids(engine, prompts, n, logprobs=True)


def correctness(main_engine, make_engine, dtype: str, sizes: Sizes, vocab: int) -> dict:
    """Triton vs torch: top-1 logprobs in the main dtype, greedy ids in fp32; graphs on vs off in fp32
    (exact equality is asked of fp32: a bf16 logit near a tie may round either way) and in the main dtype."""
    prompts = random_prompts(sizes.agree_prompts, sizes.prompt_len, vocab, seed=11)
    n = sizes.agree_tokens
    eager, graphs = graphs_on_off(main_engine, prompts, n)
    with make_engine("torch", dtype, graphs=False) as engine:
        reference = run_ids(engine, prompts, n, logprobs=True)
        engine.check_invariants()
    result = {"graphs_on_vs_off_" + dtype: agreement(ids_of(graphs), ids_of(eager)),
              "top1_logprob_triton_vs_torch": {"dtype": dtype, **top1_logprob_gap(eager, reference, dtype)}}
    if dtype != "float32":
        with make_engine("triton", "float32", graphs=True) as engine:
            eager, graphs = graphs_on_off(engine, prompts, n)
            engine.check_invariants()
        with make_engine("torch", "float32", graphs=False) as engine:
            reference = run_ids(engine, prompts, n)
            engine.check_invariants()
    fp32 = agreement(ids_of(eager), ids_of(reference))
    result["graphs_on_vs_off_float32"] = agreement(ids_of(graphs), ids_of(eager))
    result["greedy_fp32_triton_vs_torch"] = {**fp32, "goal": 0.95, "ok": fp32["fraction"] >= 0.95}
    return result


def ids_of(outs) -> list[list[int]]:
    return [o.output_ids for o in outs]


def goals(table: dict) -> dict:
    """The issue's targets; a part that failed (its entry holds "error") counts as missed."""
    def get(part: str, *keys: Any) -> Any:
        value = table.get(part)
        for k in keys:
            if not isinstance(value, dict) or k not in value:
                return None
            value = value[k]
        return value

    rows = table.get("throughput")
    by_batch = {r["batch"]: r["ratio"] for r in rows} if isinstance(rows, list) else {}
    at_least = lambda value, goal: value is not None and value >= goal  # noqa: E731
    return {
        "batch1_vs_hf>=20": at_least(by_batch.get(1), GOALS["batch1_vs_hf"]),
        "batch256_vs_hf>=5": at_least(by_batch.get(256), GOALS["batch256_vs_hf"]),
        "cascade_vs_no_cascade>=3": at_least(get("shared_prefix", "cascade_speedup"), GOALS["cascade_vs_no_cascade"]),
        "decode_hbm>=60%": at_least(get("decode_hbm", "fraction_of_peak"), GOALS["decode_hbm_fraction"]),
        "graphs_on_equals_off": get("correctness", "graphs_on_vs_off_float32", "fraction") == 1.0,
    }


class Report:
    """The JSON table, rewritten to --out after every part, so a run cut short still leaves its numbers."""

    def __init__(self, out: Path | None, table: dict[str, Any]):
        self.out, self.table = out, table

    def part(self, name: str, fn: Callable[[], Any]) -> None:
        """Runs one part; a failure is recorded under its name and the run goes on to the next part."""
        t0 = time.perf_counter()
        try:
            self.table[name] = fn()
        except Exception as e:  # noqa: BLE001 - one broken part must not cost the other figures
            traceback.print_exc()
            self.table[name] = {"error": f"{type(e).__name__}: {e}"[:500]}
        print(f"[gpu.py] {name}: {time.perf_counter() - t0:.1f} s", file=sys.stderr, flush=True)
        self.write()

    def write(self) -> str:
        text = json.dumps(self.table, indent=1)
        if self.out is not None:
            self.out.write_text(text)
        return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", required=True, help="HF folder (e.g. built by shared/gpu/make_random_model.py)")
    parser.add_argument("--quick", action="store_true", help="tiny sizes on the CPU (a smoke test)")
    parser.add_argument("--skip-kernels", action="store_true", help="leave out the kernel microbenchmark")
    parser.add_argument("--out", type=Path, help="also write the JSON table here")
    args = parser.parse_args()
    if args.quick:
        os.environ.setdefault("TRITON_INTERPRET", "1")  # before triton is imported
    ensure_importable()
    sys.path.insert(0, str(HERE))
    import torch
    from gpu_kernels import kernel_table
    from transformers import AutoModelForCausalLM

    from radixlang.runtime.engine import Engine

    t_start = time.perf_counter()
    sizes = QUICK if args.quick else FULL
    device = torch.device("cpu" if args.quick else "cuda")
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("no CUDA device: run with --quick on a CPU")
    dtype = "float32" if args.quick else "bfloat16"
    context = max(sizes.prefix_len + sizes.suffix_len, sizes.hbm_context, sizes.prompt_len) + sizes.new_tokens + \
        sizes.hbm_steps + 8
    common = {"device": device.type, "context_length": context}

    @contextmanager
    def make_engine(backend: str, engine_dtype: str, graphs: bool) -> Iterator[Engine]:
        engine = Engine(args.model, attention_backend=backend, dtype=engine_dtype, kv_cache_tokens=64 * 1024,
                        max_running_requests=sizes.agree_prompts, disable_cuda_graph=not graphs, **common)
        try:
            yield engine
        finally:
            engine.shutdown()

    report = Report(args.out, {"device": torch.cuda.get_device_name() if device.type == "cuda" else "cpu",
                               "quick": args.quick, "model": args.model, "dtype": dtype, "sizes": asdict(sizes)})
    table = report.table

    def main_engine(graphs: bool) -> Engine:
        return Engine(args.model, attention_backend="triton", dtype=dtype, kv_cache_tokens=sizes.kv_cache_tokens,
                      max_running_requests=max(sizes.batches + (sizes.prefix_requests, sizes.hbm_requests)),
                      max_prefill_tokens=sizes.max_prefill_tokens, disable_cuda_graph=not graphs, **common)

    t0 = time.perf_counter()
    try:
        engine = main_engine(graphs=True)
    except Exception as e:  # noqa: BLE001 - without graphs every other figure can still be measured
        traceback.print_exc()
        table["graph_capture_error"] = f"{type(e).__name__}: {e}"[:500]
        engine = main_engine(graphs=False)
    table["engine_startup_s"] = time.perf_counter() - t0  # loading, KV pool, capturing every graph bucket
    graphs = engine.runner.graphs
    table["graph_buckets"] = graphs.buckets if graphs is not None else []
    table["graphs_captured"] = graphs is not None and bool(graphs.graphs)
    vocab = engine.vocab_size
    engine.generate(input_ids=random_prompts(2, sizes.prompt_len, vocab, 1), sampling_params=greedy(2))  # warm-up
    hf = AutoModelForCausalLM.from_pretrained(args.model, dtype=getattr(torch, dtype)).to(device).eval()
    hf.generate(input_ids=torch.tensor(random_prompts(2, sizes.prompt_len, vocab, 2), device=device),
                max_new_tokens=2, do_sample=False, pad_token_id=0)
    with torch.inference_mode():
        report.part("throughput", functools.partial(throughput, engine, hf, sizes, vocab, device))  # hf bound now
    del hf
    report.part("shared_prefix", lambda: shared_prefix(engine, sizes, vocab))
    report.part("decode_hbm", lambda: decode_hbm(engine, sizes, vocab, device))
    report.part("correctness", lambda: correctness(engine, make_engine, dtype, sizes, vocab))
    engine.check_invariants()
    engine.shutdown()
    if not args.skip_kernels:
        with torch.inference_mode():
            report.part("kernels", lambda: kernel_table(kernel_sizes(args.quick), getattr(torch, dtype), device))
    table["goals"] = goals(table)
    table["seconds"] = time.perf_counter() - t_start
    print(report.write())


if __name__ == "__main__":
    main()
