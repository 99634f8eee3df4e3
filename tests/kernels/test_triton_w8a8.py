"""The Triton W8A8 kernels (under TRITON_INTERPRET=1 on a CPU): the row quantiser bit-equal to the CPU's
per-token quantiser (ties to even, an all-zero row, bf16 input, rows longer than one block); the int8 GEMM's
int32 sums equal to torch._int_mm and to an int64 matmul, where they pass 2**24 (no fp32 accumulator holds
them); and the whole linear equal to the CPU W8A8 linear within float rounding. Shapes are odd-sized so the
last row, column and K blocks are partial, at both row-block sizes (decode's 16, prefill's 64)."""
from __future__ import annotations

import pytest
import torch

from radixlang.kernels.registry import ATTENTION_BACKENDS
from radixlang.runtime.models.linear.w8a8 import W8A8Linear, quantize_rows_int8

pytestmark = pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_quantiser_is_bit_equal_to_the_cpu_quantiser(dtype):
    from radixlang.kernels.triton.w8a8 import QUANT_BLOCK, quantize_rows

    g = torch.Generator().manual_seed(0)
    k = QUANT_BLOCK + 77  # two blocks, the second partial
    x = torch.randn(6, k, generator=g)
    x[1] *= 1e-3
    x[2, 5] = 1e4  # an outlier: the rest of its row rounds to a few codes
    x[3] = 0.0  # no max: the scale's floor, every code 0
    x[4] = 0.0  # max 127 so scale 1: every .5 is a tie, which rounds to even as torch.round does
    x[4, :9] = torch.tensor([127.0, 0.5, -0.5, 1.5, -1.5, 2.5, -2.5, 126.5, -126.5])
    x = x.to(dtype)
    codes, scale = quantize_rows(x)
    want_codes, want_scale = quantize_rows_int8(x)
    assert codes.dtype == torch.int8 and scale.shape == (6,)
    assert torch.equal(codes, want_codes) and torch.equal(scale, want_scale[:, 0])
    assert codes[4, :9].tolist() == [127, 0, 0, 2, -2, 2, -2, 126, -126] and not codes[3].any()


@pytest.mark.parametrize("rows", [3, 20])
def test_int8_gemm_sums_are_exact_in_int32(rows):
    from radixlang.kernels.triton.w8a8 import BLOCK_K, int8_matmul

    g = torch.Generator().manual_seed(rows)
    n, k = 80, 9 * BLOCK_K + 40
    a = torch.randint(-128, 128, (rows, k), generator=g, dtype=torch.int8)
    w = torch.randint(-128, 128, (n, k), generator=g, dtype=torch.int8)
    a[0], w[0] = 127, 127  # 127**2 * k > 2**24, and odd: a float32 accumulator would round it
    a[0, 0] = w[0, 0] = -128
    got = int8_matmul(a, w)
    want = a.long() @ w.long().T
    assert want[0, 0] > 2**24 and want[0, 0] % 2 == 1
    assert got.dtype == torch.int32 and torch.equal(got.long(), want)
    assert torch.equal(got, torch._int_mm(a, w.T))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows", [3, 20])
def test_w8a8_linear_equals_the_cpu_w8a8_linear(dtype, rows):
    from radixlang.kernels.triton.w8a8 import w8a8_linear

    g = torch.Generator().manual_seed(rows)
    n, k = 80, 200
    layer = W8A8Linear.from_float(torch.randn(n, k, generator=g), torch.randn(n, generator=g))
    x = torch.randn(rows, k, generator=g).to(dtype)
    x[1] *= 100  # a row far larger: its own scale
    got = w8a8_linear(x, layer.qweight, layer.weight_scale, layer.bias)
    want = layer(x)
    assert got.dtype == dtype and got.shape == (rows, n)
    codes, x_scale = quantize_rows_int8(x)
    products = (codes.double() @ layer.qweight.double().T) * x_scale.double() * layer.weight_scale.double()
    exact = products + layer.bias.double()
    magnitude = products.abs() + layer.bias.double().abs()  # what a rounding error scales with, at cancellation too
    ulp = 2.0**-23 if dtype == torch.float32 else 2.0**-8
    # against the CPU layer: the same int32 sums and scales, so only the fp32 epilogue's rounding may differ
    # (on a GPU, a fused multiply-add), and bf16's once after it
    assert ((got.double() - want.double()).abs() <= 4 * ulp * magnitude).all()
    # against the oracle written out: the CPU codes' integer sums, rescaled in fp64
    assert ((got.double() - exact).abs() <= 4 * ulp * magnitude).all()

def test_w8a8_linear_on_no_rows_is_empty():
    from radixlang.kernels.triton.w8a8 import w8a8_linear

    layer = W8A8Linear.from_float(torch.randn(8, 32), None)
    assert w8a8_linear(torch.zeros(0, 32), layer.qweight, layer.weight_scale).shape == (0, 8)
