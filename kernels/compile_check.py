"""Compiles the Triton kernels (attention over plain and quantized KV, MLA, fused MoE, the GPTQ / AWQ dequant-GEMM,
the W8A8 int8 GEMM and its row quantiser, the gathered LoRA delta) for a CUDA GPU on a
machine without one, and reports each variant's registers, local memory (spills), shared memory and
tensor-core instructions.

CI runs the kernels under TRITON_INTERPRET=1, which executes them as numpy and accepts code that a real
compile rejects (a global that is not a constexpr, say). This check drives the Triton backend through every
kind of step it plans (extends of each row-block size, token trees, decodes of each split count, cascades,
and the fixed-shape decode of a CUDA graph) with launches turned into compiles for `--arch` (90: an H200),
down to a cubin by the ptxas that ships with triton.

    python -m radixlang.kernels.compile_check                 # bf16 and fp32, 9/3/64 and 32/8/128 heads
    python -m radixlang.kernels.compile_check --dtypes bfloat16 float16 --arch 90

Prints one JSON object per compiled variant, then a summary line; exits 1 if a variant spills, needs more
shared memory than the GPU has, or (in bf16 / fp16) does its tl.dot on CUDA cores. It must run without
TRITON_INTERPRET (the interpreter compiles nothing).
"""
from __future__ import annotations

import argparse
import contextlib
import functools
import json
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.runtime.driver import driver
from triton.runtime.jit import JITFunction

from .backend import AttentionBatch, DecodeBatch, DecodeGroups
from .kv_quant import SCALE_DTYPE, KVScales
from .kv_quant import STORAGE as KV_CODES
from .lora import TILE, plan_rows
from .triton.backend import PREFIX_CHUNK, TritonAttention, prefix_splits
from .triton.decode import MAX_SPLITS, num_splits
from .triton.dequant_gemm import dequant_gemm
from .triton.extend import block_rows
from .triton.lora import lora_delta_triton
from .triton.mla import mla_decode
from .triton.moe import fused_moe
from .triton.w8a8 import QUANT_BLOCK, int8_matmul, w8a8_linear

SHARED_BYTES = {90: 227 * 1024, 80: 163 * 1024, 89: 99 * 1024}  # opt-in dynamic shared memory per block
SIXTEEN_BIT = ("bfloat16", "float16")  # their tl.dot must use tensor cores (fp32 stays exact: "ieee", CUDA cores)
HEAD_SHAPES = ((9, 3, 64), (32, 8, 128))  # SmolLM2-135M's (heads, KV heads, head_dim); a Llama-8B-like one
MLA_SHAPE = (16, 512, 64)  # DeepSeek-V3's latent decode: (query heads on a rank, kv_lora_rank, rope dims)
MOE_SHAPE = (256, 128, 8, 2)  # (hidden, expert intermediate, experts, top-k): sizes are runtime arguments
DEQUANT_GEMM_LABEL = "dequant gemm"  # GPTQ / AWQ linears: 4- and 8-bit codes, decode and prefill row blocks
W8A8_LABEL = "w8a8 gemm"  # W8A8 int8 linears: the row quantiser, the int8 GEMM at both row blocks, scaled or not
LORA_LABEL = "lora delta"  # multi-LoRA: the gathered delta at SmolLM2's q|k|v shape, ranks 8 and 64 (x3 stacked)


@dataclass(slots=True)
class Variant:
    kernel: str
    dtype: str
    heads: str  # "heads/kv_heads/head_dim"
    constants: dict  # the variant's constexpr arguments
    num_warps: int
    shared_bytes: int  # dynamic shared memory a launch asks for
    registers: int
    local_bytes: int  # per-thread local memory: register spills, or arrays the compiler could not keep in registers
    dots: int  # tl.dot ops in the kernel's Triton IR
    tensor_core_ops: int  # MMA instructions in its PTX (mma.sync; on Hopper also wgmma.mma_async)
    approx_divisions: int = 0  # fp32 divisions not IEEE-rounded in its PTX (what Triton's `/` becomes)


class _TargetOnly:
    """Stands in for triton's CUDA driver: names the target to compile for; nothing runs."""

    def __init__(self, arch: int):
        self.target = GPUTarget("cuda", arch, 32)

    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int | None = None) -> int:
        return 0

    def get_current_target(self) -> GPUTarget:
        return self.target


@contextlib.contextmanager
def compile_only(arch: int) -> Iterator[list[tuple[str, dict, Any]]]:  # Any: triton's CompiledKernel (untyped)
    """Within it, a kernel launch compiles the kernel for `arch` and returns without running it; yields the
    list of (kernel name, constexprs, compiled kernel) that the launches fill."""
    compiled: list[tuple[str, dict, Any]] = []
    run = JITFunction.run

    def compile_instead(self, *args, grid, warmup, **kwargs):
        kernel = run(self, *args, grid=grid, warmup=True, **kwargs)
        constants = {k: v for k, v in kwargs.items() if k in self.arg_names}
        compiled.append((self.fn.__name__, constants, kernel))
        return kernel

    previous = driver._active  # None until triton first looks for a GPU (it raises on a machine without one)
    driver.set_active(_TargetOnly(arch))
    JITFunction.run = compile_instead
    try:
        yield compiled
    finally:
        JITFunction.run = run
        driver.set_active(previous)


def resources(cubin: bytes) -> tuple[int, int]:
    """(registers per thread, local memory bytes per thread) of a one-kernel cubin, from cuobjdump."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        usage = subprocess.run([str(tool), "-res-usage", f.name], capture_output=True, text=True, check=True).stdout
    reg, local = re.search(r"REG:(\d+)", usage), re.search(r"LOCAL:(\d+)", usage)
    assert reg and local, f"cuobjdump printed no resource usage: {usage!r}"
    return int(reg.group(1)), int(local.group(1))


def _chain_batch(table: torch.Tensor, kv_lens: list[int], extend_lens: list[int],
                 parents: list[list[int] | None] | None = None,
                 groups: list[tuple[list[int], int]] | None = None) -> AttentionBatch:
    positions = [p for total, n in zip(kv_lens, extend_lens) for p in range(total - n, total)]
    return AttentionBatch(table, list(range(len(kv_lens))), kv_lens, extend_lens, positions,
                          parents or [None] * len(kv_lens), groups or [])


def drive_every_step_kind(heads: int, kv_heads: int, d: int, dtype: torch.dtype) -> None:
    """Plans and runs (compile-only) each kind of step the engine makes, for this model shape and dtype:
    extends of every row-block size, with and without the LSE a cascade's prefix pass writes; decodes of every
    split count; and merges of every block of parts (BLOCK_S 1 to 32: one part up to the most a cascade has),
    though not of every part count within a block, which only bounds a mask."""
    group = heads // kv_heads
    longest = PREFIX_CHUNK * MAX_SPLITS * 2  # long enough for the most splits of either pass
    reqs = 2 * MAX_SPLITS + 2
    # row i: its own slots, wide enough for the longest decode below (its columns past `longest` wrap around the
    # pool: only the launches matter here), so every step writes its new tokens' K/V somewhere
    width = 64 << 7
    table = (torch.arange(reqs * width, dtype=torch.int32) % (reqs * longest)).view(reqs, width)
    k_cache = torch.zeros(reqs * longest + 1, kv_heads, d, dtype=dtype)
    attn = TritonAttention([k_cache], [k_cache.clone()])

    def run(tokens: int) -> None:
        q = torch.zeros(tokens, heads, d, dtype=dtype)
        kv = torch.zeros(tokens, kv_heads, d, dtype=dtype)
        attn.forward(q, kv, kv, 0, d ** -0.5)

    # extends: one per row-block size; a token tree at the largest
    rows_of = {block_rows(n, group): n for n in range(2, 65)}
    for n in rows_of.values():
        attn.plan(_chain_batch(table, [n + 7], [n]))
        run(n)
    n = max(rows_of.values())
    attn.plan(_chain_batch(table, [n + 7], [n], parents=[[j - 1 for j in range(n)]]))
    run(n)
    # decodes: one per split count (one sequence, so the KV length alone sets it)
    split_lens = {num_splits(1, kv_heads, 64 << k): 64 << k for k in range(8)}
    for length in split_lens.values():
        attn.plan(_chain_batch(table, [length], [1]))
        run(1)
    # cascades: a group per prefix pass row-block size, prefixes of each prefix split count up to the most
    for size in {block_rows(m, group): m for m in range(2, 2 * MAX_SPLITS + 1)}.values():
        for prefix in (PREFIX_CHUNK, 2 * PREFIX_CHUNK, MAX_SPLITS * PREFIX_CHUNK):
            assert prefix_splits(prefix) in (1, 2, MAX_SPLITS)
            lens = [prefix + 1 + i for i in range(size)]
            attn.plan(_chain_batch(table, lens, [1] * size, groups=[(list(range(size)), prefix)]))
            run(size)
    # a CUDA graph's fixed-shape decode, plain and as a cascade
    b = 4
    rows, kv_lens = torch.arange(b), torch.full((b,), longest // 2)
    loc = torch.arange(b)
    attn.plan_decode(DecodeBatch(table, rows, kv_lens, loc, longest))
    run(b)
    layout = DecodeGroups(torch.arange(b), torch.tensor([0, 2]), torch.tensor([2, 2]), torch.tensor([64, 64]))
    attn.plan_decode(DecodeBatch(table, rows, kv_lens, loc, longest, layout))
    run(b)


def drive_quantized_kv(codes: torch.dtype, dtype: torch.dtype) -> None:
    """The attention kernels over a quantized KV cache (kernels/kv_quant.py: int8 or e4m3 codes, fp16 scales) at
    SmolLM2's shape: an extend at the largest row block, a token tree, decodes of one and of the most splits, a
    cascade (its prefix pass writes the LSE) and a CUDA graph's decode; QUANT changes only how K and V load."""
    heads, kv_heads, d = HEAD_SHAPES[0]
    longest = PREFIX_CHUNK * MAX_SPLITS * 2
    reqs = 4
    table = torch.arange(reqs * longest, dtype=torch.int32).view(reqs, longest)
    slots = reqs * longest + 1
    scales = KVScales([torch.zeros(slots, kv_heads, dtype=SCALE_DTYPE)], [torch.zeros(slots, kv_heads, dtype=SCALE_DTYPE)])
    attn = TritonAttention([torch.zeros(slots, kv_heads, d, dtype=codes)], [torch.zeros(slots, kv_heads, d, dtype=codes)],
                           scales)

    def run(tokens: int) -> None:
        q = torch.zeros(tokens, heads, d, dtype=dtype)
        kv = torch.zeros(tokens, kv_heads, d, dtype=dtype)
        attn.forward(q, kv, kv, 0, d ** -0.5)

    n = 64
    attn.plan(_chain_batch(table, [n + 7], [n]))
    run(n)
    attn.plan(_chain_batch(table, [n + 7], [n], parents=[[j - 1 for j in range(n)]]))
    run(n)
    for length in (64, longest):
        attn.plan(_chain_batch(table, [length], [1]))
        run(1)
    lens = [2 * PREFIX_CHUNK + 1 + i for i in range(reqs)]
    attn.plan(_chain_batch(table, lens, [1] * reqs, groups=[(list(range(reqs)), 2 * PREFIX_CHUNK)]))
    run(reqs)
    attn.plan_decode(DecodeBatch(table, torch.arange(reqs), torch.full((reqs,), longest // 2), torch.arange(reqs),
                                 longest))
    run(reqs)


def drive_mla_and_moe(dtype: torch.dtype) -> None:
    """The MLA latent decode at DeepSeek-V3's row shape and both grouped GEMMs of the fused MoE (compile-only)."""
    heads, rank, rope = MLA_SHAPE
    cache = torch.zeros(64, 1, rank + rope, dtype=dtype)
    mla_decode(torch.zeros(2, heads, rank + rope, dtype=dtype), cache, torch.arange(60), torch.tensor([0, 30]),
               torch.tensor([30, 30]), rank, 0.1)
    hidden, inter, experts, k = MOE_SHAPE
    ids = torch.arange(8 * k).view(8, k) % experts
    fused_moe(torch.zeros(8, hidden, dtype=dtype), torch.zeros(experts, 2 * inter, hidden, dtype=dtype),
              torch.zeros(experts, hidden, inter, dtype=dtype), ids, torch.ones(8, k))


def drive_dequant_gemm(dtype: torch.dtype) -> None:
    """The GPTQ / AWQ dequant-GEMM for 4- and 8-bit codes at both row-block sizes (compile-only)."""
    k, n = 256, 128  # sizes are runtime arguments
    for bits in (4, 8):
        qweight = torch.zeros(k * bits // 32, n, dtype=torch.int32)
        scales, zeros = torch.zeros(k // 128, n), torch.zeros(k // 128, n, dtype=torch.int16)
        for rows in (1, 64):
            dequant_gemm(torch.zeros(rows, k, dtype=dtype), qweight, scales, zeros, torch.arange(k, dtype=torch.int32) // 128,
                         bits)


def drive_w8a8(dtype: torch.dtype) -> None:
    """The W8A8 linear (row quantiser, then the int8 GEMM with its fp32 epilogue, with and without a bias) at
    both row-block sizes, and the bare int8 GEMM (int32 out) that the tests compare exactly (compile-only)."""
    k, n = 2 * QUANT_BLOCK, 128  # sizes are runtime arguments; the quantiser's block is QUANT_BLOCK from K on
    weight, scale = torch.zeros(n, k, dtype=torch.int8), torch.ones(n)
    for rows in (1, 64):
        w8a8_linear(torch.zeros(rows, k, dtype=dtype), weight, scale, torch.zeros(n))
        w8a8_linear(torch.zeros(rows, k, dtype=dtype), weight, scale)
    int8_matmul(torch.zeros(64, k, dtype=torch.int8), weight)


def drive_lora(dtype: torch.dtype) -> None:
    """The gathered LoRA delta (kernels/triton/lora.py) on SmolLM2's fused q|k|v (576 -> 960), three adapters
    stacked per slot at ranks 8 and 64: BLOCK_R 32 and 256 (compile-only)."""
    k, n = 576, 960
    plan = plan_rows([1, 2, 0, 1], torch.device("cpu"), TILE)
    assert plan is not None
    for rank in (8, 64):
        a, b = torch.zeros(3, 3 * rank, k, dtype=dtype), torch.zeros(3, 3 * rank, n, dtype=dtype)
        lora_delta_triton(torch.zeros(4, n, dtype=dtype), torch.zeros(4, k, dtype=dtype), a, b, plan)


def check(dtypes: list[torch.dtype], arch: int) -> list[Variant]:
    if os.environ.get("TRITON_INTERPRET") == "1":
        raise SystemExit("compile_check compiles kernels: run it without TRITON_INTERPRET=1")
    variants = []
    shapes: list[tuple[str, Callable[[torch.dtype], None]]] = [
        (f"{h}/{kv}/{d}", functools.partial(drive_every_step_kind, h, kv, d)) for h, kv, d in HEAD_SHAPES]
    shapes += [(f"{HEAD_SHAPES[0][0]}/{HEAD_SHAPES[0][1]}/{HEAD_SHAPES[0][2]} kv {name}",
                functools.partial(drive_quantized_kv, codes)) for name, codes in KV_CODES.items()]
    shapes.append(("mla {}/{}+{}, moe".format(*MLA_SHAPE), drive_mla_and_moe))
    shapes.append((DEQUANT_GEMM_LABEL, drive_dequant_gemm))
    shapes.append((W8A8_LABEL, drive_w8a8))
    shapes.append((LORA_LABEL, drive_lora))
    for dtype in dtypes:
        for label, drive in shapes:
            with compile_only(arch) as compiled:
                drive(dtype)
            seen = set()
            for name, constants, kernel in compiled:
                if id(kernel) in seen:
                    continue  # a launch that hit triton's cache of compiled variants
                seen.add(id(kernel))
                registers, local = resources(kernel.asm["cubin"])
                variants.append(Variant(name, str(dtype).removeprefix("torch."), label,
                                        constants, kernel.metadata.num_warps, kernel.metadata.shared,
                                        registers, local, kernel.asm["ttir"].count("tt.dot"),
                                        len(re.findall(r"\b(?:mma\.sync|wgmma\.mma_async)\b", kernel.asm["ptx"])),
                                        len(re.findall(r"\bdiv\.(?:full|approx)\.", kernel.asm["ptx"]))))
    return variants


def problems(variants: list[Variant], arch: int) -> list[str]:
    limit = SHARED_BYTES.get(arch)
    found = []
    for v in variants:
        where = f"{v.kernel} {v.dtype} {v.heads} {v.constants}"
        if v.local_bytes:
            found.append(f"{where}: {v.local_bytes} bytes of local memory per thread (spills)")
        if limit is not None and v.shared_bytes > limit:
            found.append(f"{where}: needs {v.shared_bytes} bytes of shared memory; sm_{arch} has {limit}")
        if v.dtype in SIXTEEN_BIT and v.dots and not v.tensor_core_ops:
            found.append(f"{where}: its {v.dots} tl.dot ops run on CUDA cores, not tensor cores")
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"],
                        choices=["bfloat16", "float16", "float32"])
    parser.add_argument("--arch", type=int, default=90, help="CUDA compute capability, as 90 for sm_90")
    args = parser.parse_args(argv)
    variants = check([getattr(torch, name) for name in args.dtypes], args.arch)
    for v in variants:
        print(json.dumps(asdict(v)))
    found = problems(variants, args.arch)
    for line in found:
        print(line, file=sys.stderr)
    print(json.dumps({"arch": args.arch, "triton": triton.__version__, "variants": len(variants),
                      "problems": len(found)}))
    return 1 if found else 0


if __name__ == "__main__":
    raise SystemExit(main())
