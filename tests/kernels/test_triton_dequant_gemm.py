"""The Triton dequant-GEMM (under TRITON_INTERPRET=1 on a CPU) against W = scale * (code - zero) per group,
written out here and multiplied in fp64: 4- and 8-bit codes, three groups, a bias, output columns that do
not fill the last column block, and both row-block sizes (decode's 16, prefill's 64)."""
from __future__ import annotations

import pytest
import torch

from radixlang.kernels.registry import ATTENTION_BACKENDS
from radixlang.runtime.models.linear.quant_formats import pack_int32

pytestmark = pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")


@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize("rows", [3, 20])
def test_dequant_gemm_is_x_times_the_dequantised_weights(bits, rows):
    from radixlang.kernels.triton.dequant_gemm import dequant_gemm

    g = torch.Generator().manual_seed(bits * rows)
    n, k, groups = 80, 96, 3
    codes = torch.randint(0, 2**bits, (n, k), generator=g, dtype=torch.int32)
    zeros = torch.randint(0, 2**bits + 1, (groups, n), generator=g, dtype=torch.int32)  # v1 zeros reach 2**bits
    scales = torch.rand(groups, n, generator=g).half().float() * 0.01
    g_idx = torch.arange(k) // (k // groups)
    weight = torch.empty(n, k, dtype=torch.float64)
    for col in range(k):
        weight[:, col] = scales[g_idx[col]].double() * (codes[:, col] - zeros[g_idx[col]]).double()
    x, bias = torch.randn(rows, k, generator=g), torch.randn(n, generator=g)
    got = dequant_gemm(x, pack_int32(codes.T, bits, dim=0), scales, zeros.to(torch.int16), g_idx.int(), bits, bias)
    want = x.double() @ weight.T + bias.double()
    assert got.shape == (rows, n) and got.dtype == x.dtype
    assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
