"""The quantized KV cache's format (kernels/kv_quant.py) against its defining equations, and every attention backend
over int8 / e4m3 KV against attention written from its definition on the dequantized values (the exact semantics:
only fp32 rounding apart) and on the unquantized ones (the format's error, within a bound)."""
from __future__ import annotations

import math

import pytest
import torch

from radixlang.kernels import reference
from radixlang.kernels.cpu import block_kernel
from radixlang.kernels.kv_quant import KVScales, dequantize, quantize, rotate, storage_dtype
from radixlang.kernels.registry import ATTENTION_BACKENDS, create_backend

from .test_attention import LAYERS, D, chain, naive, scenario, tree

FORMATS = [torch.int8, torch.float8_e4m3fn]


def rows(seed: int = 0) -> torch.Tensor:
    """Rows of very different magnitudes, an all-zero row and an outlier, as K and V rows are."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(64, 3, 64, generator=g) * torch.logspace(-3, 2, 64)[:, None, None]
    x[5] = 0
    x[7, 1, 3] = 900.0
    return x


def test_int8_codes_and_scales_are_the_equations_own():
    x = rows()
    codes, scales = quantize(x, torch.int8)
    # scale = fp16(amax / 127), code = round-half-even(x / scale): written out in float64
    amax = x.double().abs().amax(-1).clamp(min=127 * 2.0 ** -14)
    want_scale = (amax / 127).to(torch.float16)
    assert torch.equal(scales, want_scale)
    want_codes = torch.round(x.double() / want_scale.double()[..., None]).clamp(-127, 127)
    assert torch.equal(codes.double(), want_codes)
    back = dequantize(codes, scales, torch.float32)
    assert bool(((back - x).abs() <= scales.float()[..., None] / 2 * (1 + 1e-6)).all())  # half a step at most
    assert bool((back[5] == 0).all()) and back[7, 1, 3].item() == pytest.approx(900.0, rel=1e-3)


def test_e4m3_rows_keep_three_mantissa_bits():
    x = rows(1)
    codes, scales = quantize(x, torch.float8_e4m3fn)
    assert codes.dtype == torch.float8_e4m3fn
    assert torch.equal(scales, (x.abs().amax(-1).clamp(min=448 * 2.0 ** -14) / 448).to(torch.float16))
    scaled = x / scales.float()[..., None]
    err = (dequantize(codes, scales, torch.float32) - x).abs() / scales.float()[..., None]
    normal = scaled.abs() >= 2.0 ** -6  # e4m3's normal range: relative error 2^-4 at most (3 mantissa bits)
    assert bool((err[normal] <= scaled.abs()[normal] * 2.0 ** -4 * (1 + 1e-6)).all())
    assert bool((err[~normal] <= 2.0 ** -10 * (1 + 1e-6)).all())  # subnormals: half of the step 2^-9
    assert float(scaled.abs().max()) <= 448 * (1 + 2.0 ** -10)


@pytest.mark.parametrize("d", [64, 128, 96])  # 96: three blocks of 32
def test_rotate_is_the_orthonormal_walsh_hadamard_matrix_and_its_own_inverse(d):
    block = d & -d
    sylvester = torch.ones(1, 1, dtype=torch.float64)
    while sylvester.shape[0] < block:  # H_2n = [[H, H], [H, -H]]
        sylvester = torch.cat((torch.cat((sylvester, sylvester), 1), torch.cat((sylvester, -sylvester), 1)))
    h = torch.block_diag(*[sylvester / math.sqrt(block)] * (d // block))
    x = rows(2)[..., :1].expand(-1, -1, d) * torch.randn(d, dtype=torch.float32)
    assert torch.allclose(rotate(x).double(), x.double() @ h.T, rtol=1e-5, atol=1e-4)
    assert torch.allclose(rotate(rotate(x)), x, rtol=1e-5, atol=1e-4)
    assert torch.equal(rotate(x[:3]), rotate(x)[:3])  # a row's bits are its own, whatever the batch


def test_unknown_kv_cache_dtype_names_the_choices():
    with pytest.raises(ValueError, match="kv_cache_dtype.*'fp4'"):
        storage_dtype("fp4", torch.float32)


def quantized_scenario(kv_lens, extend_lens, parents, fmt, seed=0):
    """test_attention's scenario with its caches quantized as a pool holds them (K rotated): (codes, scales, the
    unquantized caches)."""
    k_bufs, v_bufs, slots, batch, q, k, v = scenario(kv_lens, extend_lens, parents, seed)
    codes, scales, plain = ([], []), KVScales([], []), ([], [])
    for bufs, c, s, p, turn in ((k_bufs, codes[0], scales.k, plain[0], rotate),
                                (v_bufs, codes[1], scales.v, plain[1], lambda x: x)):
        for buf in bufs:
            qc, qs = quantize(turn(buf), fmt)
            c.append(qc)
            s.append(qs)
            p.append(buf)
    return codes, scales, plain, slots, batch, q, k, v


def dequantized(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    return dequantize(codes, scales, torch.float32)


@pytest.mark.parametrize("fmt", FORMATS, ids=["int8", "fp8_e4m3"])
@pytest.mark.parametrize("name", sorted(ATTENTION_BACKENDS))
def test_attention_over_quantized_kv_matches_the_definition(name, fmt):
    # decodes, an extend over a cached prefix, a first token, a prefill, and a token tree
    parents = [-1, 0, 0, 1, 2, -1]
    kv_lens, extend_lens = [5, 9, 1, 7, 12, 10], [1, 4, 1, 7, 1, 6]
    (k_codes, v_codes), scales, (k_plain, v_plain), slots, batch, q, k, v = quantized_scenario(
        kv_lens, extend_lens, [None] * 5 + [parents], fmt)
    backend = create_backend(name, k_codes, v_codes, scales)
    if name == "torch" and block_kernel.available() and reference.rows_op() is not None:
        assert backend._use_rows  # the C++ fixed-order attention reads the codes itself
    backend.plan(batch)
    new_slots = torch.cat([s[-n:] for s, n in zip(slots, extend_lens)])
    seqs = [(s, n, chain(total, n)) for s, total, n in zip(slots[:5], kv_lens, extend_lens)]
    seqs.append((slots[5], 6, tree(10, parents)))
    for layer in range(LAYERS):
        out = backend.forward(q, k, v, layer, 1 / math.sqrt(D))
        # the new rows were quantized on write, like every other row
        codes, s = quantize(rotate(k), fmt)
        assert torch.equal(k_codes[layer][new_slots].view(torch.uint8), codes.view(torch.uint8))
        assert torch.equal(scales.k[layer][new_slots], s)
        assert torch.equal(v_codes[layer][new_slots].view(torch.uint8), quantize(v, fmt)[0].view(torch.uint8))
        # the keys the codes stand for: H (H k) = k, up to the rounding
        keys = rotate(dequantized(k_codes[layer], scales.k[layer]))
        exact = naive(q, keys, dequantized(v_codes[layer], scales.v[layer]), seqs)
        assert torch.allclose(out, exact, atol=2e-5)
        k_plain[layer][new_slots], v_plain[layer][new_slots] = k, v
        unquantized = naive(q, k_plain[layer], v_plain[layer], seqs)
        bound = 0.05 if fmt == torch.int8 else 0.25  # unit-variance K/V: half an int8 step, 2^-4 relative for e4m3
        assert (out - unquantized).abs().max().item() < bound


@pytest.mark.skipif(not block_kernel.available(wait=True), reason="no block kernel (AVX2 and g++)")
def test_every_e4m3_code_reads_as_its_value_in_the_cpu_attention():
    # one key per query row: its softmax weight is exactly 1, so the output is the V row as the kernel widened it
    # (scale 1), which must be each finite code's value bit for bit (the NaN codes 0x7F / 0xFF are never written)
    finite = [b for b in range(256) if b & 0x7F != 0x7F] + [0, 0]  # 254 codes and two zeros: four 64-wide rows
    v_cache = torch.tensor(finite, dtype=torch.uint8).view(torch.float8_e4m3fn).reshape(4, 1, 64)
    slots = torch.arange(len(v_cache))
    q = torch.randn(len(v_cache), 1, 64)
    ones = torch.ones(len(v_cache), 1, dtype=torch.float16)
    out = reference.rows_op()(q, torch.zeros_like(v_cache), v_cache, slots, slots, torch.ones_like(slots), 0.125,
                              ones, ones)
    assert torch.equal(out, v_cache.float())  # exact (-0 sums to +0 in the kernel, and equals it)
