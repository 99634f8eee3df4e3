"""An online Hadamard rotation of a linear's input (QuaRot, Ashkboos et al. 2024; SpinQuant): y = (W H^T)(H x)
with H orthonormal, so the linear's function is unchanged while its input is rotated at run time.

Why: per-token int8 activations round each row with one scale, its max |x|. SmolLM2's down_proj input
(silu(gate) * up) has a few channels hundreds of times larger than the rest, so the scale is set by them and
the other channels keep only a few levels. H spreads every channel over all the others: a row's max falls
towards its root mean square, and the rounding error with it. The weights W H^T are rotated once, offline
(quantize/smoothquant.py); the rotation of x costs a small matmul per row.

H is a Hadamard matrix (entries +-1, H H^T = n I) scaled by 1 / sqrt(n), built as the Kronecker product
P (x) S of a Paley matrix P of order q + 1 (q a prime = 3 mod 4; 12 for SmolLM2's 1536 = 12 x 128) and a
Sylvester matrix S of order 2^k (P = [1] when n is a power of two). S is itself the Kronecker product of
Sylvester matrices of orders 16 and less (S_2^(a+b) = S_2^a (x) S_2^b), so x, viewed as [q + 1, 16, .., 8],
is multiplied by each small factor along its own axis: n (q + 1 + 16 + ..) multiply-adds a row, not n^2.
For SmolLM2's down_proj (2048 rows) that took 15-23 ms against 57-89 ms for P (x) S_128 in two matmuls with
transposes between (the shared 2-core VM, loaded; the W8A8 down_proj itself: 29-35 ms). Each factor runs as
a batched matmul of one small problem per row (torch.matmul broadcasting the factor), the same for every
row whatever the batch, so a row's rotation does not depend on the rows beside it (docs/determinism.md;
checked in tests/runtime/models/test_hadamard.py).
"""
from __future__ import annotations

import torch
from torch import nn

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


SMALL = 16  # the largest Sylvester factor: its [rows, 16, 16] products stay in registers


def factor_sizes(n: int) -> list[int]:
    """The orders of H's Kronecker factors, outermost first: the Paley order (if any), then powers of two of
    at most SMALL."""
    p, s = hadamard_factors(n)
    sizes = [p] if p > 1 else []
    while s > 1:
        sizes.append(min(s, SMALL))
        s //= sizes[-1]
    return sizes or [1]


class HadamardInput(nn.Module):
    """`inner` (whose weights are W H^T) on H x: the function of W on x."""

    def __init__(self, size: int, inner: nn.Module, dtype: torch.dtype = torch.float32,
                 device: torch.device | None = None):
        super().__init__()
        self.size = size
        sizes = factor_sizes(size)
        p = hadamard_factors(size)[0]
        for i, k in enumerate(sizes):  # orthonormal factors, buffers (they move with the model)
            h = paley(k) if i == 0 and p > 1 else sylvester(k)
            self.register_buffer(f"factor{i}", (h / k ** 0.5).to(dtype=dtype, device=device), persistent=False)
        self.sizes = sizes
        self.inner = inner

    def rotate(self, x: torch.Tensor) -> torch.Tensor:
        """H x of every row of x [..., size]."""
        rows = x.reshape(-1, self.size)
        factors = [getattr(self, f"factor{i}") for i in range(len(self.sizes))]
        last, k = factors[-1], self.sizes[-1]
        m = rows.shape[0]
        # the innermost axis: rows [m, size / k, k] times its factor's transpose, one product per row
        y = torch.bmm(rows.reshape(m, self.size // k, k), last.T.expand(m, k, k))
        inner = k
        for factor, k in zip(reversed(factors[:-1]), reversed(self.sizes[:-1])):
            y = torch.matmul(factor, y.reshape(-1, k, inner))  # this factor's axis, the inner ones after it
            inner *= k
        return y.reshape(x.shape)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(self.rotate(x))
