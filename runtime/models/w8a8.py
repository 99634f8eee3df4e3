"""W8A8 int8 linears: per-output-channel int8 weights, per-token dynamic int8 activations, and the matmul
in int8 with int32 accumulation (torch._int_mm), as SmoothQuant runs them.

Each input row x is scaled by its own max|x| / 127 and rounded, so y = (xq @ wq^T) * x_scale * w_scale.
The int32 products are exact; all the error is the two roundings, which SmoothQuant keeps small by moving
activation outliers into the weights before the weights are rounded (quantize/smoothquant.py).
"""
from __future__ import annotations

import torch
from torch import nn

_TINY = torch.finfo(torch.float32).tiny


def quantize_rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: (codes [M, K] int8, scale [M, 1] fp32) with x ~ codes * scale."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp(min=_TINY) / 127.0
    return torch.round(x.float() / scale).clamp(-127, 127).to(torch.int8), scale


class W8A8Linear(nn.Module):
    """y = x W^T + b with W = qweight * weight_scale (one scale per output channel)."""

    qweight: torch.Tensor  # buffers, registered in __init__
    weight_scale: torch.Tensor

    def __init__(self, qweight: torch.Tensor, weight_scale: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        assert qweight.dtype == torch.int8 and weight_scale.shape == (qweight.shape[0], 1)
        self.register_buffer("qweight", qweight.contiguous())
        self.register_buffer("weight_scale", weight_scale.float().reshape(1, -1))
        self.bias = None if bias is None else nn.Parameter(bias.detach().float().clone(), requires_grad=False)

    @classmethod
    def from_float(cls, weight: torch.Tensor, bias: torch.Tensor | None) -> "W8A8Linear":
        codes, scale = quantize_rows_int8(weight.detach())
        return cls(codes, scale, bias)

    def dequantized(self) -> torch.Tensor:
        return self.qweight.float() * self.weight_scale.T

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        codes, x_scale = quantize_rows_int8(flat)
        acc = torch._int_mm(codes, self.qweight.T)  # int32, exact: |sum| <= K * 127**2 < 2**31 for K < 2**17
        out = acc.float() * x_scale * self.weight_scale
        if self.bias is not None:
            out = out + self.bias
        return out.to(x.dtype).view(*x.shape[:-1], out.shape[-1])
