"""What the compiled decode forward pays for its opaque RMSNorm (runtime/models/llama.py: `radixlang::rms_norm`).

Inductor fused each RMSNorm into the residual add before it and reduced in its own order, so the compiled decode's
logprobs differed from eager's in the last bits (issue 43). The norm is now one opaque op running eager's kernel.
This compiles the default model's decode forward twice in one process, with the opaque norm and with the norm
traced into inductor's fused loops (the old graph), and times one forward of each, alternating, at each batch:

    python benchmark/opaque_norm.py --rows 1,16 --repeats 200

Figures are per forward (the model's decode step, no logits or sampling); the ratio is the cost of invariance.
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import time
from typing import Callable, Iterator

import torch

from radixlang.kernels.registry import create_backend
from radixlang.runtime.engine import Engine
from radixlang.runtime.models import compiled, llama
from radixlang.runtime.models.llama import ForwardContext


@contextlib.contextmanager
def norm_as(fused_norm: bool) -> Iterator[None]:
    """`fused_norm`: RMSNorm's compiled branch traces the eager math (inductor fuses it), for as long as the graph
    runs (dynamo guards on the function: leaving it would recompile)."""
    opaque = llama.rms_norm_op
    if fused_norm:
        llama.rms_norm_op = llama.rms_norm  # type: ignore[assignment]
    try:
        yield
    finally:
        llama.rms_norm_op = opaque


def run(fn: Callable, args: tuple, fused_norm: bool, repeats: int) -> tuple[float, torch.Tensor]:
    """The output and the best of 5 means of `repeats` calls, in ms (the first call compiles, untimed)."""
    with norm_as(fused_norm):
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
    with Engine(args.model, device="cpu", kv_cache_tokens=4096, quantization=args.quantization, compile_layers=False) as engine:
        model = engine.runner.model
        attn = engine.runner.attn
        for rows in (int(r) for r in args.rows.split(",")):
            make = functools.partial(create_backend, engine.config.attention_backend)
            scratch = compiled._scratch_backend(make, attn.k_buffers, attn.v_buffers, rows)
            kv_lens = tuple(3 + i % 5 for i in range(rows))
            plan = scratch.plan(compiled._scratch_batch(rows, kv_lens, rows))
            ids = torch.arange(rows, dtype=torch.int64) * 7
            call = (ids, plan.positions, ForwardContext(scratch))
            with torch.inference_mode():
                eager = model.forward(*call)
                fns = {fused: torch.compile(compiled.own_code(model.forward), dynamic=False,
                                            options=dict(compiled.COMPILE_OPTIONS)) for fused in (False, True)}
                first = {fused: run(fn, call, fused, args.repeats) for fused, fn in fns.items()}
                again = {fused: run(fn, call, fused, args.repeats) for fused, fn in fns.items()}  # alternated
            best = {fused: min(first[fused][0], again[fused][0]) for fused in fns}
            same = {fused: torch.equal(first[fused][1], eager) for fused in fns}
            print(f"{rows} row(s): opaque norm {best[False]:.3f} ms, fused norm {best[True]:.3f} ms per forward: "
                  f"opaque / fused = {best[False] / best[True]:.3f}x; equal to eager bit for bit: "
                  f"opaque {same[False]}, fused {same[True]}", flush=True)


if __name__ == "__main__":
    main()
