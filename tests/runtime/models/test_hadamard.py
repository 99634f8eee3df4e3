"""The online Hadamard rotation of down_proj's input: H is an exact Hadamard matrix (entries +-1, H H^T = n I,
checked in integers), the module applies it through its small Kronecker factors, row by row whatever the batch, and a W8A8 linear on rotated
inputs computes the fp linear (float64) with a fraction of the unrotated W8A8's error where the input has
outlier channels."""
from __future__ import annotations

import pytest
import torch

from radixlang.runtime.models.linear.hadamard import HadamardInput, hadamard, hadamard_factors
from radixlang.runtime.models.linear.w8a8 import W8A8Linear


@pytest.mark.parametrize("n", [1536, 12, 64, 160])  # SmolLM2's intermediate size; Paley alone; Sylvester alone; 20 x 8
def test_h_is_an_exact_hadamard_matrix(n):
    h = hadamard(n) * n ** 0.5
    signs = h.round()
    assert (h - signs).abs().max() < 1e-9 and set(signs.unique().tolist()) == {-1.0, 1.0}
    gram = signs.long() @ signs.long().T  # integers: exact
    assert torch.equal(gram, n * torch.eye(n, dtype=torch.long))


def test_sizes_without_a_construction_are_refused():
    assert hadamard_factors(1536) == (12, 128)
    with pytest.raises(ValueError, match="no Hadamard rotation of size 11008"):
        hadamard_factors(11008)


@pytest.mark.parametrize("n", [1536, 576, 64])  # Paley 12 x 16 x 8; Paley 72 x 8; Sylvester 16 x 4
def test_the_module_rotates_each_row_by_h_the_same_alone_or_in_a_batch(n):
    module = HadamardInput(n, torch.nn.Identity())
    x = torch.randn(37, n, generator=torch.Generator().manual_seed(0))
    got = module(x)
    assert torch.allclose(got.double(), x.double() @ hadamard(n).T, atol=1e-5)
    assert all(torch.equal(module(x[i:i + 1])[0], got[i]) for i in (0, 17, 36))
    assert torch.equal(module(x[5:30]), got[5:30])


def test_w8a8_on_rotated_inputs_computes_the_fp_linear_and_tames_outlier_channels():
    """Oracle: x W^T in float64. The input has 3 channels 300x the rest, as silu(gate) * up has: per-token int8
    then keeps the others on a level or two; rotated, the row's max falls ~20x (measured error 0.058 -> 0.0086,
    most of it now the weights' own per-channel rounding)."""
    g = torch.Generator().manual_seed(1)
    n, out = 1536, 96
    w, x = torch.randn(out, n, generator=g), torch.randn(64, n, generator=g)
    x[:, [5, 700, 1400]] *= 300
    want = x.double() @ w.double().T
    plain = W8A8Linear.from_float(w, None)(x)
    rotated = HadamardInput(n, W8A8Linear.from_float((w.double() @ hadamard(n).T).float(), None))(x)

    def error(y: torch.Tensor) -> float:
        return float((y.double() - want).norm() / want.norm())

    print(f"relative error: W8A8 {error(plain):.4f}, rotated {error(rotated):.4f}")
    assert error(rotated) < 0.015 and error(rotated) < 0.25 * error(plain)
