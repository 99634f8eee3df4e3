"""The quantized KV cache's format: int8 or float8 e4m3 codes with one scale per (token, KV head).

Each new token's K (and V) row of one KV head, x [head_dim], is stored as
    scale = fp16(max(amax(|x|), QMAX * SCALE_FLOOR) / QMAX),  code = round(x / scale) clamped to [-QMAX, QMAX]
(int8: QMAX 127, round half to even; e4m3: QMAX 448, the cast's own round to nearest even), and read back as
code * scale. K rows are stored rotated (`rotate`: a Walsh-Hadamard transform) and queries rotated alike. A row's codes depend on that row alone, so the KV of a token is the same bits whatever the batch,
the chunking or the cached prefix it was written beside; and an int8 row's error is at most scale / 2 per value.
The scale is rounded to fp16 before the codes are computed from it, so storing it in fp16 loses nothing.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

# kv_cache_dtype (vLLM's / SGLang's names) -> the codes' dtype; "auto" stores the compute dtype unquantized
STORAGE = {"int8": torch.int8, "fp8_e4m3": torch.float8_e4m3fn}
QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}  # the largest code of each storage dtype
SCALE_DTYPE = torch.float16  # 2 bytes per (token, head): a 64-wide head costs 66 bytes instead of bf16's 128
SCALE_FLOOR = 2.0 ** -14  # fp16's smallest normal: an all-zero (or tiny) row still gets a finite, exact scale


@dataclass(slots=True)
class KVScales:
    """Per-layer scale buffers beside a quantized pool's K and V codes: [slots, kv_heads] SCALE_DTYPE each."""

    k: list[torch.Tensor]
    v: list[torch.Tensor]


def storage_dtype(kv_cache_dtype: str, compute: torch.dtype) -> torch.dtype:
    """The pool's element dtype for an engine's `kv_cache_dtype` ('auto': the compute dtype)."""
    if kv_cache_dtype == "auto":
        return compute
    if kv_cache_dtype not in STORAGE:
        raise ValueError(f"kv_cache_dtype must be 'auto' or one of {sorted(STORAGE)}, got {kv_cache_dtype!r}")
    return STORAGE[kv_cache_dtype]


def is_quantized(dtype: torch.dtype) -> bool:
    return dtype in QMAX


def rotate(x: torch.Tensor) -> torch.Tensor:
    """x [..., d] times the orthonormal Walsh-Hadamard matrix H (blocks of the largest power of 2 dividing d), which
    is its own inverse: a quantized pool stores H k and attention takes H q, as (H q) . (H k) = q . k. It spreads a
    K row's outlier channels (RoPE's slow pairs) over all of them, so the rounding error no longer sits on the few
    products that dominate q . k (fp8_e4m3's perplexity cost on SmolLM2's long text: +1.0-1.4% without, +0.2% with).
    Butterflies of adds and subtracts, elementwise: a row's bits do not depend on its batch (a matmul's do)."""
    d = x.shape[-1]
    block, lead = d & -d, x.shape[:-1]
    y = x.float().reshape(*lead, d // block, block)  # in fp32: a 16-bit input's sums would round at every stage
    half = 1
    while half < block:
        pairs = y.view(*lead, d // block, block // (2 * half), 2, half)
        a, b = pairs[..., 0, :], pairs[..., 1, :]
        y = torch.stack((a + b, a - b), -2).view(*lead, d // block, block)
        half *= 2
    return (y * block ** -0.5).view(x.shape).to(x.dtype)


def quantize(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """x [..., d] -> (codes [..., d] of `dtype`, scales [...] SCALE_DTYPE), one scale per row of d."""
    qmax = QMAX[dtype]
    x = x.float()
    amax = x.abs().amax(-1).clamp(min=qmax * SCALE_FLOOR)
    scale = (amax / qmax).to(SCALE_DTYPE)
    scaled = (x / scale.float()[..., None]).clamp(-qmax, qmax)
    codes = scaled.round().to(dtype) if dtype == torch.int8 else scaled.to(dtype)
    return codes, scale


def dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """codes [..., d] and scales [...] -> values [..., d] of `dtype` (computed in fp32)."""
    return (codes.float() * scales.float()[..., None]).to(dtype)


def write_kv(cache: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor, x: torch.Tensor) -> None:
    """Stores new rows x [n, kv_heads, d] at `slots` of one layer's cache: quantized where `scales` is given."""
    if scales is None:
        cache.index_copy_(0, slots, x.to(cache.dtype))
        return
    codes, scale = quantize(x, cache.dtype)
    # index_copy_ has no float8 kernel on every device: the codes go in as their bytes
    cache.view(torch.uint8).index_copy_(0, slots, codes.view(torch.uint8))
    scales.index_copy_(0, slots, scale)


def read_kv(cache: torch.Tensor, scales: torch.Tensor | None, slots: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """Rows `slots` (any shape) of one layer's cache as `dtype`: [*slots.shape, kv_heads, d]."""
    flat = slots.reshape(-1)
    if scales is None:
        rows = cache.index_select(0, flat).to(dtype)
    else:
        codes = cache.view(torch.uint8).index_select(0, flat).view(cache.dtype)
        rows = dequantize(codes, scales.index_select(0, flat), dtype)
    return rows.view(*slots.shape, *cache.shape[1:])
