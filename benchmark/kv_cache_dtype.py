"""The quantized KV cache (kv_cache_dtype int8 / fp8_e4m3) on SmolLM2-135M, one run: the KV bytes a token takes
and the pool a memory budget buys; the perplexity of fidelity.py's fixed text (206 tokens) and long text (~1.2k
tokens) against the unquantized KV (`auto`: fp32 on the CPU; the weights are the same in every engine, the
default mode's unless --quantization says otherwise, so the KV is the only difference); and decode tok/s over a
long context (each sequence's ~2.4k-token prompt cached, then --new-tokens greedy tokens), at batch 1 and batch 4,
the engines interleaved round by round (the best round counts, so machine load hits them alike), as same-run ratios
against `auto`. On the CPU, also the fixed-order attention op alone (`attention_rows`, the decode's kernel) over
each format's rows: 4 query rows over 2.4k random keys each, 30 layers' calls, the best of 30 rounds interleaved.

    python -m radixlang.benchmark.kv_cache_dtype                       # CPU
    python -m radixlang.benchmark.kv_cache_dtype --quantization none   # fp32 weights
    python -m radixlang.benchmark.kv_cache_dtype --device cuda --dtype bfloat16

Goals (issue 48): int8 perplexity within 0.5% of the unquantized KV's, fp8_e4m3 within 1%; ~2x the tokens of a
16-bit pool in the same bytes.
"""
from __future__ import annotations

import argparse
import time

import torch

from radixlang.benchmark.fidelity import FIXED_TEXT, LONG_TEXT, perplexity
from radixlang.benchmark.results import save
from radixlang.kernels import reference
from radixlang.kernels.cpu import block_kernel
from radixlang.kernels.kv_quant import quantize, rotate, storage_dtype
from radixlang.runtime.engine import Engine
from radixlang.runtime.kv.memory import KVPool

KV_DTYPES = ("auto", "int8", "fp8_e4m3")
SMOLLM = (30, 3, 64)  # layers, KV heads, head_dim
GREEDY = {"temperature": 0, "ignore_eos": True}


def long_prompts(count: int) -> list[str]:
    """Distinct ~2.4k-token prompts (each its own KV: no shared prefix)."""
    return [f"({i}) {LONG_TEXT}\n\n{LONG_TEXT}" for i in range(count)]


def decode_rate(engine: Engine, prompts: list[str], new_tokens: int) -> float:
    """tok/s of decoding `new_tokens` per prompt over its cached long context."""
    engine.generate(prompts, {**GREEDY, "max_new_tokens": 1})  # the prompts' KV cached
    t0 = time.perf_counter()
    outs = engine.generate(prompts, {**GREEDY, "max_new_tokens": new_tokens})
    elapsed = time.perf_counter() - t0
    assert all(o.meta.cached_tokens >= o.meta.prompt_tokens - 1 for o in outs), "the long context was cached"
    return sum(o.meta.completion_tokens for o in outs) / elapsed


def attention_op_ms(rows: int = 4, context: int = 2400, rounds: int = 30) -> dict[str, float]:
    """ms of 30 layers' `attention_rows` calls per KV dtype (SmolLM2's heads, `rows` decode rows over `context`
    random slots each of a 12k-slot cache), the best of `rounds` interleaved; {} where the C++ op is not built."""
    if not block_kernel.available(wait=True) or (op := reference.rows_op()) is None:
        return {}
    layers, kv_heads, head_dim = SMOLLM
    heads, pool = 3 * kv_heads, 12_000  # SmolLM2's 9 query heads, 3 per KV head
    gen = torch.Generator().manual_seed(0)
    keys, values = (torch.randn(pool, kv_heads, head_dim, generator=gen) for _ in range(2))
    caches = {"auto": (keys, values, None, None)}
    for name in KV_DTYPES[1:]:
        codes = storage_dtype(name, torch.float32)
        (k, k_scale), (v, v_scale) = quantize(rotate(keys), codes), quantize(values, codes)  # K rotated, as the pool's
        caches[name] = (k, v, k_scale, v_scale)
    q = torch.randn(rows, heads, head_dim, generator=gen)
    slots = torch.cat([torch.randperm(pool, generator=gen)[:context] for _ in range(rows)])
    offsets, lengths = torch.arange(rows) * context, torch.full((rows,), context)
    best = {name: float("inf") for name in caches}
    for _ in range(rounds):
        for name, (k, v, ks, vs) in caches.items():
            t0 = time.perf_counter()
            for _ in range(layers):
                op(q, k, v, slots, offsets, lengths, head_dim ** -0.5, ks, vs)
            best[name] = min(best[name], time.perf_counter() - t0)
    return {name: 1e3 * t for name, t in best.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default="auto", help="compute dtype (the unquantized KV's)")
    parser.add_argument("--quantization", default="auto", help="weights, the same in every engine: auto | none | ...")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=1, help="speed rounds; each engine's best counts")
    parser.add_argument("--publish", action="store_true", help="also write docs/results/kv_cache_dtype.json")
    args = parser.parse_args()
    engines = {name: Engine(device=args.device, dtype=args.dtype, quantization=args.quantization,
                            kv_cache_tokens=24_000, kv_cache_dtype=name) for name in KV_DTYPES}
    figures: dict[str, dict[str, float]] = {name: {} for name in KV_DTYPES}
    try:
        compute = engines["auto"].config.torch_dtype()
        print(f"KV bytes per token (SmolLM2-135M, {str(compute).removeprefix('torch.')} compute) and tokens per GiB:")
        for name in KV_DTYPES:
            for dtype in (compute, torch.bfloat16):
                per = KVPool.bytes_per_token(*SMOLLM, dtype, kv_cache_dtype=name)
                figures[name][f"bytes/token vs {dtype}"] = per
                print(f"  {name:9} vs a {str(dtype).removeprefix('torch.'):8} pool: {per:6d} B, "
                      f"{(1 << 30) // per:7d} tokens/GiB ({KVPool.bytes_per_token(*SMOLLM, dtype) / per:.2f}x)")
        print("\nperplexity (vs auto)")
        for label, text in (("fixed text", FIXED_TEXT), ("long text", LONG_TEXT)):
            ppl = {name: perplexity(e, text) for name, e in engines.items()}
            for name in KV_DTYPES:
                figures[name][f"ppl {label}"] = ppl[name]
            print(f"  {label:10} " + "  ".join(f"{n} {ppl[n]:.3f} ({100 * (ppl[n] / ppl['auto'] - 1):+.2f}%)"
                                                for n in KV_DTYPES), flush=True)
        workloads = {"decode b1 @2.4k": long_prompts(1), "decode b4 @2.4k": long_prompts(4)}
        best: dict[str, dict[str, float]] = {name: {} for name in KV_DTYPES}
        for _ in range(args.repeats):
            for workload, prompts in workloads.items():
                for name, engine in engines.items():
                    rate = decode_rate(engine, prompts, args.new_tokens)
                    best[name][workload] = max(best[name].get(workload, 0.0), rate)
        print(f"\n{'tok/s':10}" + "".join(f"{w:>18}" for w in workloads))
        for name in KV_DTYPES:
            figures[name] |= best[name]
            ratios = " ".join(f"{best[name][w] / best['auto'][w]:.2f}x" for w in workloads)
            print(f"{name:10}" + "".join(f"{best[name][w]:18.1f}" for w in workloads) + f"   vs auto {ratios}")
        if args.device == "cpu" and (op_ms := attention_op_ms()):
            print("\nattention_rows, 30 layers, 4 rows over 2.4k keys: " + "  ".join(
                f"{n} {op_ms[n]:.1f} ms ({op_ms['auto'] / op_ms[n]:.2f}x)" for n in KV_DTYPES))
            for name in KV_DTYPES:
                figures[name]["attention op ms"] = op_ms[name]
        for engine in engines.values():
            engine.check_invariants()
    finally:
        for engine in engines.values():
            engine.shutdown()
    print(f"saved {save('kv_cache_dtype', figures, publish=args.publish)}")


if __name__ == "__main__":
    main()
