"""Attention kernel microbenchmark for benchmark/gpu.py: the Triton backend's decode and extend against
torch SDPA on dense tensors (no paging: the speed to aim at) and the torch reference backend (gather +
SDPA), on the paged KV layout the engine uses (each request's slots contiguous, as a fresh prefill
leaves them); and the fixed-shape decode plan (what the decode graphs capture) of requests sharing a
prefix, with and without its cascade group. Each case reports milliseconds per call and, for Triton
decode, the KV bytes read per second (for the cascade, the prefix pass's programs and K/V bytes, counted
from its grid and tile sizes); the MLA latent decode kernel against SDPA over the same latent rows
(dense), the fused-MoE kernel against the grouped per-expert matmuls of the CPU path, and the GPTQ / AWQ
dequant-GEMM against a matmul on its dequantized weights (the bytes of weights it reads per second, too),
and the W8A8 int8 linear (row quantiser + int8 GEMM with its rescale) against a matmul in the activations'
dtype on the same weights, with its parts and torch._int_mm (cuBLAS) timed apart, and checked there: codes
bit-equal to the CPU quantiser's formula run by torch, int32 sums exact. A case that fails (out of memory, a missing SDPA kernel) records its error instead."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from radixlang.kernels.backend import AttentionBatch, DecodeBatch, DecodeGroups
from radixlang.kernels.mla import latent_decode
from radixlang.kernels.registry import create_backend
from radixlang.kernels.triton.extend import extend_grid


@dataclass(frozen=True, slots=True)
class KernelSizes:
    heads: tuple[tuple[int, int, int], ...]  # (query heads, KV heads, head_dim)
    decode_requests: tuple[int, ...]
    decode_contexts: tuple[int, ...]
    extend_requests: tuple[int, ...]
    extend_contexts: tuple[int, ...]
    max_kv_bytes: int  # skip a case whose K + V exceed this
    reference_max_kv_bytes: int  # the reference gathers a copy of the KV: time it only below this
    max_extend_tokens: int
    cascade_requests: tuple[int, ...]  # decodes sharing one prefix
    cascade_prefixes: tuple[int, ...]
    cascade_suffix: int  # each request's own tokens after the prefix
    mla_shapes: tuple[tuple[int, int, int], ...] = ()  # (query heads, kv_lora_rank, rope dims)
    mla_requests: tuple[int, ...] = ()
    mla_contexts: tuple[int, ...] = ()
    moe_shapes: tuple[tuple[int, int, int, int], ...] = ()  # (hidden, expert intermediate, experts, top_k)
    moe_tokens: tuple[int, ...] = ()
    dequant_shapes: tuple[tuple[int, int, int, int], ...] = ()  # (in, out, bits, group size) of a linear
    dequant_rows: tuple[int, ...] = ()
    w8a8_shapes: tuple[tuple[int, int], ...] = ()  # (in, out) of a linear
    w8a8_rows: tuple[int, ...] = ()


def bench_ms(fn: Callable[[], object], device: torch.device) -> float:
    """Median ms per call: Triton's do_bench on CUDA (CUDA events, cache flushed); one timed call after a
    warm-up elsewhere (the interpreter is slow, and CPU figures only show the script runs)."""
    if device.type == "cuda":
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=10, rep=40))
    fn()
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def _kv(tokens: int, kv_heads: int, d: int, dtype: torch.dtype, device: torch.device):
    k = torch.randn(tokens, kv_heads, d, dtype=dtype, device=device)
    return k, torch.randn_like(k)


def _timed(fn: Callable[[], object], device: torch.device) -> float | str:
    try:
        return bench_ms(fn, device)
    except Exception as e:  # noqa: BLE001 - one case's failure (OOM, no kernel) must not end the run
        if device.type == "cuda":
            torch.cuda.empty_cache()
        return f"error: {str(e).splitlines()[0][:160]}"


def _paged_batch(requests: int, context: int, new: int, device: torch.device) -> AttentionBatch:
    table = torch.arange(requests * context, dtype=torch.int32, device=device).view(requests, context)
    positions = [p for _ in range(requests) for p in range(context - new, context)]
    return AttentionBatch(table, list(range(requests)), [context] * requests, [new] * requests, positions,
                          [None] * requests)


def decode_case(heads: int, kv_heads: int, d: int, requests: int, context: int, dtype: torch.dtype,
                device: torch.device, sizes: KernelSizes) -> dict:
    kv_bytes = 2 * requests * context * kv_heads * d * torch.empty((), dtype=dtype).element_size()
    row = {"heads": heads, "kv_heads": kv_heads, "head_dim": d, "requests": requests, "context": context,
           "kv_bytes": kv_bytes}
    k_cache, v_cache = _kv(requests * context, kv_heads, d, dtype, device)
    q = torch.randn(requests, heads, d, dtype=dtype, device=device)
    k, v = _kv(requests, kv_heads, d, dtype, device)
    batch, scale = _paged_batch(requests, context, 1, device), 1 / math.sqrt(d)
    triton_attn = create_backend("triton", [k_cache], [v_cache])
    triton_attn.plan(batch)
    row["triton_ms"] = _timed(lambda: triton_attn.forward(q, k, v, 0, scale), device)
    dense_k = k_cache.view(requests, context, kv_heads, d).transpose(1, 2)  # [b, kv_heads, L, d], no copy
    dense_v = v_cache.view(requests, context, kv_heads, d).transpose(1, 2)
    q4 = q.unsqueeze(2)  # [b, heads, 1, d]
    row["sdpa_ms"] = _timed(lambda: F.scaled_dot_product_attention(q4, dense_k, dense_v, scale=scale,
                                                                   enable_gqa=True), device)
    row["reference_ms"] = None
    if kv_bytes <= sizes.reference_max_kv_bytes:
        reference = create_backend("torch", [k_cache], [v_cache])
        reference.plan(batch)
        row["reference_ms"] = _timed(lambda: reference.forward(q, k, v, 0, scale), device)
    if isinstance(row["triton_ms"], float):
        row["triton_tb_s"] = kv_bytes / (row["triton_ms"] * 1e-3) / 1e12
    return row


def extend_case(heads: int, kv_heads: int, d: int, requests: int, context: int, dtype: torch.dtype,
                device: torch.device, sizes: KernelSizes) -> dict:
    """A causal prefill of `context` new tokens per request (no cached prefix)."""
    tokens = requests * context
    row = {"heads": heads, "kv_heads": kv_heads, "head_dim": d, "requests": requests, "context": context}
    k_cache, v_cache = _kv(tokens, kv_heads, d, dtype, device)
    q = torch.randn(tokens, heads, d, dtype=dtype, device=device)
    k, v = _kv(tokens, kv_heads, d, dtype, device)
    batch, scale = _paged_batch(requests, context, context, device), 1 / math.sqrt(d)
    triton_attn = create_backend("triton", [k_cache], [v_cache])
    triton_attn.plan(batch)
    row["triton_ms"] = _timed(lambda: triton_attn.forward(q, k, v, 0, scale), device)
    q4 = q.view(requests, context, heads, d).transpose(1, 2)
    k4 = k.view(requests, context, kv_heads, d).transpose(1, 2)
    v4 = v.view(requests, context, kv_heads, d).transpose(1, 2)
    row["sdpa_ms"] = _timed(lambda: F.scaled_dot_product_attention(q4, k4, v4, is_causal=True, scale=scale,
                                                                   enable_gqa=True), device)
    row["reference_ms"] = None
    kv_bytes = 2 * tokens * kv_heads * d * torch.empty((), dtype=dtype).element_size()
    if kv_bytes <= sizes.reference_max_kv_bytes and context <= 4096:  # its [n, total] masks grow as n^2
        reference = create_backend("torch", [k_cache], [v_cache])
        reference.plan(batch)
        row["reference_ms"] = _timed(lambda: reference.forward(q, k, v, 0, scale), device)
    if isinstance(row["triton_ms"], float):
        flops = 4 * requests * heads * d * context * (context + 1) / 2  # QK^T and PV over the causal half
        row["triton_tflop_s"] = flops / (row["triton_ms"] * 1e-3) / 1e12
    return row


def cascade_case(heads: int, kv_heads: int, d: int, requests: int, prefix: int, suffix: int, dtype: torch.dtype,
                 device: torch.device) -> dict:
    """`requests` decodes whose KV starts with the same `prefix` slots, then `suffix` slots of their own:
    one layer's forward under the fixed-shape decode plan, plain (each reads the prefix) and cascade."""
    row = {"heads": heads, "kv_heads": kv_heads, "head_dim": d, "requests": requests, "prefix": prefix,
           "suffix": suffix}
    k_cache, v_cache = _kv(prefix + requests * suffix, kv_heads, d, dtype, device)
    own = prefix + torch.arange(requests * suffix, dtype=torch.int32, device=device).view(requests, suffix)
    shared = torch.arange(prefix, dtype=torch.int32, device=device).expand(requests, prefix)
    table = torch.cat((shared, own), dim=1)
    rows = torch.arange(requests, device=device)
    kv_lens = torch.full((requests,), prefix + suffix, device=device)
    loc = table[:, -1].long()
    one = torch.ones(1, dtype=torch.int64, device=device)
    groups = DecodeGroups(rows, 0 * one, requests * one, prefix * one)
    q = torch.randn(requests, heads, d, dtype=dtype, device=device)
    k, v = _kv(requests, kv_heads, d, dtype, device)
    scale, outs = 1 / math.sqrt(d), {}
    for name, layout in (("plain", None), ("cascade", groups)):
        attn = create_backend("triton", [k_cache], [v_cache])
        attn.plan_decode(DecodeBatch(table, rows, kv_lens, loc, prefix + suffix, layout))
        forward = lambda attn=attn: attn.forward(q, k, v, 0, scale)  # noqa: E731
        row[f"{name}_ms"] = _timed(forward, device)
        if isinstance(row[f"{name}_ms"], float):
            outs[name] = forward().float()
    # the prefix pass (per KV split): a program per KV head and block of (member, head) rows, each reading
    # its KV head's chunk; so every KV head's prefix is read `blocks` times in all
    _, _, blocks = extend_grid(1, requests, heads, kv_heads)
    row["prefix_programs_per_split"] = kv_heads * blocks
    row["prefix_kv_bytes"] = blocks * 2 * prefix * kv_heads * d * torch.empty((), dtype=dtype).element_size()
    if len(outs) == 2:
        row["speedup"] = row["plain_ms"] / row["cascade_ms"]
        row["max_abs_diff"] = (outs["plain"] - outs["cascade"]).abs().max().item()  # the same attention
    return row


def mla_decode_case(heads: int, rank: int, rope: int, requests: int, context: int, dtype: torch.dtype,
                    device: torch.device) -> dict:
    """Absorbed MLA decode: each request's query heads over its `context` latent rows [c_kv | k_rope]."""
    from radixlang.kernels.triton.mla import mla_decode

    row = {"heads": heads, "kv_lora_rank": rank, "rope": rope, "requests": requests, "context": context}
    cache = torch.randn(requests * context, 1, rank + rope, dtype=dtype, device=device)
    q = torch.randn(requests, heads, rank + rope, dtype=dtype, device=device)
    slots = torch.arange(requests * context, device=device)
    starts = torch.arange(requests, device=device) * context
    lens = torch.full((requests,), context, device=device)
    scale = (rank + rope) ** -0.5
    row["triton_ms"] = _timed(lambda: mla_decode(q, cache, slots, starts, lens, rank, scale), device)
    dense = cache.view(requests, context, rank + rope)
    row["sdpa_ms"] = _timed(lambda: latent_decode(q, dense, None, rank, scale), device)
    if isinstance(row["triton_ms"], float):
        row["triton_tb_s"] = cache.numel() * cache.element_size() / (row["triton_ms"] * 1e-3) / 1e12
        got = mla_decode(q, cache, slots, starts, lens, rank, scale).float()
        row["max_abs_diff"] = (got - latent_decode(q, dense, None, rank, scale).float()).abs().max().item()
    return row


def fused_moe_case(hidden: int, inter: int, experts: int, top_k: int, tokens: int, dtype: torch.dtype,
                   device: torch.device) -> dict:
    """The routed experts of one layer for `tokens` tokens (uniform random routing): the Triton fused-MoE
    kernel against one matmul pair per active expert (the CPU path, runtime/models/moe.py)."""
    from radixlang.kernels.triton.moe import fused_moe
    from radixlang.runtime.models.moe import grouped_mlp

    row = {"hidden": hidden, "inter": inter, "experts": experts, "top_k": top_k, "tokens": tokens}
    x = torch.randn(tokens, hidden, dtype=dtype, device=device)
    gate_up = torch.randn(experts, 2 * inter, hidden, dtype=dtype, device=device) * hidden**-0.5
    down = torch.randn(experts, hidden, inter, dtype=dtype, device=device) * inter**-0.5
    ids = torch.rand(tokens, experts, device=device).topk(top_k, dim=-1).indices
    weights = torch.rand(tokens, top_k, device=device)

    def grouped() -> torch.Tensor:
        order = ids.flatten().argsort(stable=True)
        counts = torch.bincount(ids.flatten(), minlength=experts).tolist()
        out = grouped_mlp(x.index_select(0, order // top_k), counts, list(range(experts)), gate_up, down)
        out = out * weights.flatten()[order, None].to(out.dtype)
        return torch.zeros_like(x).index_add_(0, order // top_k, out)

    row["triton_ms"] = _timed(lambda: fused_moe(x, gate_up, down, ids, weights), device)
    row["grouped_ms"] = _timed(grouped, device)
    if isinstance(row["triton_ms"], float) and isinstance(row["grouped_ms"], float):
        row["speedup"] = row["grouped_ms"] / row["triton_ms"]
        row["max_abs_diff"] = (fused_moe(x, gate_up, down, ids, weights).float() - grouped().float()).abs().max().item()
    return row


def dequant_gemm_case(k: int, n: int, bits: int, group: int, rows: int, dtype: torch.dtype, device: torch.device) -> dict:
    """One GPTQ / AWQ linear on `rows` rows: the Triton dequant-GEMM reading the packed codes, against a
    matmul on the same weights dequantized to `dtype` (what the GPU path ran before)."""
    from radixlang.kernels.triton.dequant_gemm import dequant_gemm
    from radixlang.runtime.models.linear.quant_formats import pack_int32

    row: dict = {"in": k, "out": n, "bits": bits, "group": group, "rows": rows}
    codes = torch.randint(0, 2**bits, (n, k), dtype=torch.int32, device=device)
    scales = torch.rand(k // group, n, device=device) * 0.01
    zeros = torch.full((k // group, n), 2 ** (bits - 1), dtype=torch.int16, device=device)
    g_idx = torch.arange(k, dtype=torch.int32, device=device) // group
    qweight = pack_int32(codes.T.cpu(), bits, dim=0).to(device)
    weight = ((codes - zeros.T.repeat_interleave(group, 1)).float() * scales.T.repeat_interleave(group, 1)).to(dtype)
    x = torch.randn(rows, k, dtype=dtype, device=device)
    row["triton_ms"] = _timed(lambda: dequant_gemm(x, qweight, scales, zeros, g_idx, bits), device)
    row["dense_ms"] = _timed(lambda: x @ weight.T, device)
    if isinstance(row["triton_ms"], float) and isinstance(row["dense_ms"], float):
        row["speedup"] = row["dense_ms"] / row["triton_ms"]
        weight_bytes = qweight.numel() * 4 + scales.numel() * 4 + zeros.numel() * 2
        row["weight_gb_s"] = weight_bytes / row["triton_ms"] / 1e6
        want = (x @ weight.T).float()
        got = dequant_gemm(x, qweight, scales, zeros, g_idx, bits).float()
        row["max_rel_diff"] = ((got - want).abs().max() / want.abs().max()).item()
    return row


def w8a8_case(k: int, n: int, rows: int, dtype: torch.dtype, device: torch.device) -> dict:
    """One W8A8 linear on `rows` rows: the Triton path whole (quantise the rows, int8 GEMM, rescale) and its
    two parts, torch._int_mm (cuBLAS int8; it refuses some shapes) on the same codes, and a dense matmul
    in `dtype` on the dequantized weights (what a W8A8 folder ran on the GPU before)."""
    from radixlang.kernels.triton.w8a8 import int8_matmul, quantize_rows, w8a8_linear
    from radixlang.runtime.models.linear.w8a8 import quantize_rows_int8

    row: dict = {"in": k, "out": n, "rows": rows}
    qweight, w_scale = quantize_rows_int8(torch.randn(n, k, device=device) * 0.02)
    weight = (qweight.float() * w_scale).to(dtype)
    x = torch.randn(rows, k, dtype=dtype, device=device)
    codes, x_scale = quantize_rows(x)
    row["triton_ms"] = _timed(lambda: w8a8_linear(x, qweight, w_scale), device)
    row["quantize_ms"] = _timed(lambda: quantize_rows(x), device)
    row["int8_gemm_ms"] = _timed(lambda: int8_matmul(codes, qweight), device)
    row["torch_int_mm_ms"] = _timed(lambda: torch._int_mm(codes, qweight.T), device)
    row["dense_ms"] = _timed(lambda: x @ weight.T, device)
    if isinstance(row["triton_ms"], float) and isinstance(row["dense_ms"], float):
        row["speedup"] = row["dense_ms"] / row["triton_ms"]
    if isinstance(row["int8_gemm_ms"], float):
        row["int8_tops"] = 2 * rows * k * n / row["int8_gemm_ms"] / 1e9
    want_codes, want_scale = quantize_rows_int8(x)  # the CPU's formula, in torch on this device
    row["codes_bit_equal"] = torch.equal(codes, want_codes) and torch.equal(x_scale, want_scale[:, 0])
    sums = codes.double() @ qweight.double().T  # exact: |sums| < 2**53
    row["int32_exact"] = torch.equal(int8_matmul(codes, qweight).double(), sums)
    want = sums * x_scale.double()[:, None] * w_scale.double().T
    got = w8a8_linear(x, qweight, w_scale).double()
    row["max_rel_diff"] = ((got - want).abs().max() / want.abs().max()).item()
    return row


def kernel_table(sizes: KernelSizes, dtype: torch.dtype, device: torch.device) -> dict[str, list[dict]]:
    decode, extend, cascade = [], [], []
    elsize = torch.empty((), dtype=dtype).element_size()
    for heads, kv_heads, d in sizes.heads:
        for requests in sizes.decode_requests:
            for context in sizes.decode_contexts:
                if 2 * requests * context * kv_heads * d * elsize <= sizes.max_kv_bytes:
                    decode.append(decode_case(heads, kv_heads, d, requests, context, dtype, device, sizes))
        for requests in sizes.extend_requests:
            for context in sizes.extend_contexts:
                if requests * context <= sizes.max_extend_tokens:
                    extend.append(extend_case(heads, kv_heads, d, requests, context, dtype, device, sizes))
        for requests in sizes.cascade_requests:
            for prefix in sizes.cascade_prefixes:
                cascade.append(cascade_case(heads, kv_heads, d, requests, prefix, sizes.cascade_suffix, dtype, device))
        if device.type == "cuda":
            torch.cuda.empty_cache()
    mla = [mla_decode_case(heads, rank, rope, requests, context, dtype, device)
           for heads, rank, rope in sizes.mla_shapes for requests in sizes.mla_requests for context in sizes.mla_contexts]
    moe = [fused_moe_case(*shape, tokens, dtype, device) for shape in sizes.moe_shapes for tokens in sizes.moe_tokens]
    dequant = [dequant_gemm_case(*shape, rows, dtype, device) for shape in sizes.dequant_shapes for rows in sizes.dequant_rows]
    w8a8 = [w8a8_case(*shape, rows, dtype, device) for shape in sizes.w8a8_shapes for rows in sizes.w8a8_rows]
    return {"decode": decode, "extend": extend, "cascade": cascade, "mla_decode": mla, "fused_moe": moe,
            "dequant_gemm": dequant, "w8a8": w8a8}
