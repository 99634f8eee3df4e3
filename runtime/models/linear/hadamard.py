"""An online Hadamard rotation of a linear's input (QuaRot, Ashkboos et al. 2024; SpinQuant): y = (W H^T)(H x)
with H orthonormal, so the linear's function is unchanged while its input is rotated at run time.

Why: per-token int8 activations round each row with one scale, its max |x|. SmolLM2's down_proj input
(silu(gate) * up) has a few channels hundreds of times larger than the rest, so the scale is set by them and
the other channels keep only a few levels. H spreads every channel over all the others: a row's max falls
towards its root mean square, and the rounding error with it. The weights W H^T are rotated once, offline
(quantize/smoothquant.py); the rotation of x costs a small matmul per row.

H is a Hadamard matrix (entries +-1, H H^T = n I) scaled by 1 / sqrt(n), built as the Kronecker product
P (x) S of a Paley matrix P of order q + 1 (q a prime = 3 mod 4; 12 for SmolLM2's 1536 = 12 x 128) and a
Sylvester matrix S of order 2^k (P = [1] when n is a power of two). Applied as P X S^T on x viewed as
[q + 1, 2^k]: n (q + 1 + 2^k) multiply-adds a row instead of n^2. Both factors run on FixedOrderLinear
(kernels/cpu/dense_linear.py's fixed-order matmul on the CPU), so a row's rotation does not depend on the
rows beside it (docs/determinism.md).
"""
from __future__ import annotations

import torch
from torch import nn

from ...distributed.layers import FixedOrderLinear

_PALEY_MAX = 128  # the largest Paley factor tried (order q + 1)


def _is_prime(q: int) -> bool:
    return q > 1 and all(q % d for d in range(2, int(q ** 0.5) + 1))


def hadamard_factors(n: int) -> tuple[int, int]:
    """(p, s): n = p * s with s a power of two and p = 1 or a Paley order (p - 1 a prime = 3 mod 4).
    Raises ValueError where no such split exists."""
    for p in range(1, min(n, _PALEY_MAX) + 1):
        s = n // p
        if n % p == 0 and s & (s - 1) == 0 and (p == 1 or (p - 1) % 4 == 3 and _is_prime(p - 1)):
            return p, s
    raise ValueError(f"no Hadamard rotation of size {n}: it must be 2^k times 1 or q + 1 (q a prime = 3 mod 4)")


def sylvester(n: int) -> torch.Tensor:
    """The Sylvester Hadamard matrix of order n (a power of two), +-1, float64."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)])
    return h


def paley(p: int) -> torch.Tensor:
    """Paley's first construction, order p = q + 1 (q a prime = 3 mod 4): I + [[0, 1^T], [-1, Q]] with
    Q[i, j] the quadratic character of j - i mod q. +-1, float64."""
    q = p - 1
    squares = {i * i % q for i in range(1, q)}
    chi = torch.tensor([0] + [1 if d in squares else -1 for d in range(1, q)], dtype=torch.float64)
    idx = torch.arange(q)
    skew = torch.zeros(p, p, dtype=torch.float64)
    skew[0, 1:], skew[1:, 0] = 1, -1
    skew[1:, 1:] = chi[(idx[None, :] - idx[:, None]) % q]
    return skew + torch.eye(p, dtype=torch.float64)


def hadamard(n: int) -> torch.Tensor:
    """The orthonormal rotation H of size n (float64): (P (x) S) / sqrt(n), as HadamardInput applies it."""
    p, s = hadamard_factors(n)
    return torch.kron(paley(p) if p > 1 else torch.ones(1, 1, dtype=torch.float64), sylvester(s)) / n ** 0.5


def _factor(h: torch.Tensor, dtype: torch.dtype, device: torch.device) -> FixedOrderLinear:
    linear = FixedOrderLinear(h.shape[0], h.shape[0], bias=False, device=device, dtype=dtype)
    linear.weight.requires_grad_(False).copy_(h / h.shape[0] ** 0.5)
    return linear


class HadamardInput(nn.Module):
    """`inner` (whose weights are W H^T) on H x: the function of W on x."""

    def __init__(self, size: int, inner: nn.Module, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None):
        super().__init__()
        p, s = hadamard_factors(size)
        self.size, self.p, self.s = size, p, s
        self.right = _factor(sylvester(s), dtype, device or torch.device("cpu"))
        self.left = _factor(paley(p), dtype, device or torch.device("cpu")) if p > 1 else None
        self.inner = inner

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """H x of every row of x [..., size]."""
        rows = x.reshape(-1, self.size)
        m = rows.shape[0]
        y = self.right(rows.reshape(m * self.p, self.s))  # each row's p blocks times S^T
        if self.left is not None:  # mixes the blocks: P on the block index
            y = self.left(y.view(m, self.p, self.s).transpose(1, 2).reshape(m * self.s, self.p))
            y = y.view(m, self.s, self.p).transpose(1, 2)
        return y.reshape(x.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.rotate(x))
