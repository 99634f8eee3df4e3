"""What the native fixed-order RMSNorm (`radixlang_cpu::rms_norm` / `add_rms_norm`, kernels/cpu/dense_mm.cpp) costs
or saves in the decode forward, eager and compiled.

Inductor fused torch's RMSNorm into the residual add before it and summed in its own order, so the compiled decode's
logprobs differed from eager's in the last bits (issue 43). The norms now run one native op (no Python) in both
forwards. This times one decode forward of the default model, per batch size, four ways, alternated in one process:
compiled with the native norm against compiled with torch's norm (inductor's fused loops: the old graph), and eager
with either norm:

    python benchmark/native_norm.py --rows 1,16 --repeats 100

Figures are per forward (the model's decode step, no logits or sampling), the best of 5 means; "= eager" says
whether that forward's hidden states equal the eager forward's with the same norm bit for bit.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import os
import time
from typing import Callable, Iterator

import torch
from torch import nn

from radixlang.kernels.cpu import block_kernel
from radixlang.kernels.registry import create_backend
from radixlang.runtime.engine import Engine
from radixlang.runtime.models import compiled
from radixlang.runtime.models.llama import ForwardContext, RMSNorm


@contextlib.contextmanager
def native_norm(model: nn.Module, on: bool) -> Iterator[None]:
    """The model's norms on the native op (`on`) or torch's, for as long as a forward runs (dynamo guards on the
    flag: each compiled function only ever runs under one value, so neither recompiles)."""
    norms = [m for m in model.modules() if isinstance(m, RMSNorm)]
    before = [m.fixed_order for m in norms]
    for m in norms:
        m.fixed_order = on
    try:
        yield
    finally:
        for m, was in zip(norms, before):
            m.fixed_order = was


def timed(fn: Callable, args: tuple, repeats: int) -> tuple[float, torch.Tensor]:
    """The output and the best of 5 means of `repeats` calls, in ms (one call first, untimed: a compile)."""
    out = fn(*args)
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn(*args)
        best = min(best, (time.perf_counter() - t0) * 1000 / repeats)
    return best, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rows", default="1,16", help="decode batch sizes, comma-separated")
    parser.add_argument("--repeats", type=int, default=100)
    parser.add_argument("--quantization", default="auto")
    parser.add_argument("--model", default=None, help="a GGUF file or HF folder (default: SmolLM2-135M)")
    args = parser.parse_args()
    compiled.use_our_inductor_cache()
    if not block_kernel.available(wait=True):
        raise SystemExit("no native kernel library here (AVX2 and g++): nothing to compare")
    with Engine(args.model, device="cpu", kv_cache_tokens=4096, quantization=args.quantization,
                compile_layers=False) as engine:
        model = engine.runner.model
        attn = engine.runner.attn
        print(f"load average before: {os.getloadavg()}, threads {torch.get_num_threads()}", flush=True)
        for rows in (int(r) for r in args.rows.split(",")):
            make = functools.partial(create_backend, engine.config.attention_backend)
            scratch = compiled._scratch_backend(make, attn.k_buffers, attn.v_buffers, rows)
            kv_lens = tuple(3 + i % 5 for i in range(rows))
            plan = scratch.plan(compiled._scratch_batch(rows, kv_lens, rows))
            ids = torch.arange(rows, dtype=torch.int64) * 7
            call = (ids, plan.positions, ForwardContext(scratch))
            ways = {("compiled", on): torch.compile(compiled.own_code(model.forward), dynamic=False,
                                                    options=dict(compiled.COMPILE_OPTIONS)) for on in (True, False)}
            ways |= {("eager", on): model.forward for on in (True, False)}
            results: dict[tuple[str, bool], list[tuple[float, torch.Tensor]]] = {way: [] for way in ways}
            with torch.inference_mode():
                for _ in range(2):  # alternated: each way twice, interleaved with the others
                    for (kind, on), fn in ways.items():
                        with native_norm(model, on):
                            results[kind, on].append(timed(fn, call, args.repeats))
            best = {way: min(t for t, _ in runs) for way, runs in results.items()}
            same = {(kind, on): torch.equal(results[kind, on][0][1], results["eager", on][0][1])
                    for kind, on in ways}
            print(f"{rows} row(s), ms per forward: compiled native norm {best['compiled', True]:.3f} "
                  f"(= eager: {same['compiled', True]}), compiled inductor's norm {best['compiled', False]:.3f} "
                  f"(= eager: {same['compiled', False]}): native / inductor = "
                  f"{best['compiled', True] / best['compiled', False]:.3f}x; eager native norm "
                  f"{best['eager', True]:.3f}, eager torch's norm {best['eager', False]:.3f}: native / torch = "
                  f"{best['eager', True] / best['eager', False]:.3f}x", flush=True)
        print(f"load average after: {os.getloadavg()}", flush=True)


if __name__ == "__main__":
    main()
