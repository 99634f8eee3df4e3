"""radixlang_cpu::dense_mm (dense_mm.cpp), the fp32 linears' matmul in one order per output: bitwise equal to the
order its source documents, emulated here in torch (each fused multiply-add as an fp64 product and sum rounded to
fp32), and so the same bits for a row whatever the rows beside it and the thread count."""
from __future__ import annotations

import pytest
import torch

from radixlang.kernels.cpu import block_kernel

pytestmark = pytest.mark.skipif(not block_kernel.available(wait=True), reason="no AVX2 CPU or no C++ compiler")
LANES = 16


def documented_order(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Lane l accumulates x[r, k] * w[n, k] over k = 16 t + l (fma: exact product, one rounding), the last vector
    zero-padded; then the lanes fold l + (l + 8), + 4, + 2, + 1, each sum rounded to fp32."""
    m, k = x.shape
    pad = -k % LANES
    xs, ws = torch.nn.functional.pad(x, (0, pad)).double(), torch.nn.functional.pad(w, (0, pad)).double()
    acc = torch.zeros(m, w.shape[0], LANES, dtype=torch.float32)
    for t in range(0, k + pad, LANES):
        acc = (acc.double() + xs[:, None, t:t + LANES] * ws[None, :, t:t + LANES]).float()
    for half in (8, 4, 2, 1):
        acc = acc[..., :half] + acc[..., half:2 * half]
    return acc[..., 0]


@pytest.mark.parametrize("k", [53, 64])  # a zero-padded last vector; whole vectors
def test_dense_mm_computes_its_documented_order(k):
    g = torch.Generator().manual_seed(k)
    x, w = torch.randn(7, k, generator=g), torch.randn(37, k, generator=g)  # odd rows and features: every tile size
    y = torch.ops.radixlang_cpu.dense_mm(x, w)
    assert torch.equal(y, documented_order(x, w))
    assert torch.allclose(y.double(), x.double() @ w.double().T, atol=1e-5)


def test_a_rows_result_does_not_depend_on_the_call():
    g = torch.Generator().manual_seed(1)
    x, w = torch.randn(600, 96, generator=g), torch.randn(70, 96, generator=g)
    op = torch.ops.radixlang_cpu.dense_mm
    whole = op(x, w)
    alone = torch.cat([op(x[r:r + 1], w) for r in (0, 5, 599)])
    assert torch.equal(alone, whole[[0, 5, 599]])
    for rows in (2, 3, 5, 13):
        assert torch.equal(op(x[:rows], w), whole[:rows]), rows
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        assert torch.equal(op(x, w), whole)
    finally:
        torch.set_num_threads(threads)


def test_dense_mm_refuses_bad_operands():
    op = torch.ops.radixlang_cpu.dense_mm
    with pytest.raises(RuntimeError, match="float32"):
        op(torch.randn(2, 8, dtype=torch.float64), torch.randn(3, 8))
    with pytest.raises(RuntimeError, match="columns"):
        op(torch.randn(2, 8), torch.randn(3, 9))
