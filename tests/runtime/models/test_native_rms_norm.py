"""radixlang_cpu::rms_norm / add_rms_norm (dense_mm.cpp), the models' RMSNorm in one summation order, called by the
eager and the compiled forward alike: close to a float64 RMSNorm, and the same bits for a row whatever the rows
beside it and the thread count."""
from __future__ import annotations

import pytest
import torch

from radixlang.kernels.cpu import block_kernel

pytestmark = pytest.mark.skipif(not block_kernel.available(wait=True), reason="no AVX2 CPU or no C++ compiler")
EPS = 1e-5


def reference(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """RMSNorm in float64."""
    x = x.double()
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS) * w.double()


@pytest.mark.parametrize("k", [53, 576])  # a zero-padded last vector; SmolLM2's hidden size
def test_the_norms_equal_a_float64_rms_norm(k):
    g = torch.Generator().manual_seed(k)
    x, delta, w = torch.randn(9, k, generator=g), torch.randn(9, k, generator=g), torch.randn(k, generator=g)
    y = torch.ops.radixlang_cpu.rms_norm(x, w, EPS)
    assert y.dtype == torch.float32 and y.shape == x.shape
    assert torch.allclose(y.double(), reference(x, w), rtol=1e-5, atol=1e-5)
    s, ys = torch.ops.radixlang_cpu.add_rms_norm(x, delta, w, EPS)
    assert torch.equal(s, x + delta)  # one rounding per element, as torch's add
    assert torch.equal(ys, torch.ops.radixlang_cpu.rms_norm(x + delta, w, EPS))
    heads = torch.ops.radixlang_cpu.rms_norm(x.view(9, 1, k)[:, :, :], w, EPS)  # any leading shape: rows of k
    assert torch.equal(heads.view(9, k), y)


def test_a_rows_norm_does_not_depend_on_the_call():
    g = torch.Generator().manual_seed(1)
    x, delta, w = torch.randn(700, 576, generator=g), torch.randn(700, 576, generator=g), torch.randn(576, generator=g)
    for op, args in ((torch.ops.radixlang_cpu.rms_norm, (w, EPS)),
                     (torch.ops.radixlang_cpu.add_rms_norm, (w, EPS))):
        def call(rows: slice) -> torch.Tensor:
            out = op(x[rows], *((delta[rows],) if op is torch.ops.radixlang_cpu.add_rms_norm else ()), *args)
            return out[1] if isinstance(out, tuple) else out
        whole = call(slice(None))  # 700 rows: split over the threads
        for rows in (1, 2, 3, 16, 129):
            assert torch.equal(call(slice(0, rows)), whole[:rows]), rows
        assert torch.equal(call(slice(699, 700)), whole[699:])
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            assert torch.equal(call(slice(None)), whole)
        finally:
            torch.set_num_threads(threads)


def test_the_norms_refuse_bad_operands():
    with pytest.raises(RuntimeError, match="float32"):
        torch.ops.radixlang_cpu.rms_norm(torch.randn(2, 8, dtype=torch.float64), torch.randn(8), EPS)
    with pytest.raises(RuntimeError, match="features"):
        torch.ops.radixlang_cpu.rms_norm(torch.randn(2, 8), torch.randn(9), EPS)
    with pytest.raises(RuntimeError, match="shape"):
        torch.ops.radixlang_cpu.add_rms_norm(torch.randn(2, 8), torch.randn(3, 8), torch.randn(8), EPS)
