"""W8A8 int8 linears: per-output-channel int8 weights, per-token dynamic int8 activations, and the matmul
in int8 with int32 accumulation (torch._int_mm), as SmoothQuant runs them.

Each input row x is scaled by its own max|x| / 127 and rounded, so y = (xq @ wq^T) * x_scale * w_scale.
The int32 products are exact; all the error is the two roundings, which SmoothQuant keeps small by moving
activation outliers into the weights before the weights are rounded (quantize/smoothquant.py).

Speed (CPU): the int8 matmul (oneDNN's s8s8s32 gemm behind torch._int_mm, VNNI) took 1/8 of an fp32
matmul's time and 1/2 of a bf16 one's at SmolLM2's shapes on the Zen 5 VM (benchmark/w8a8_linear.py), but
the elementwise work around it eats much of that: the int32 products and the fp32 output are [rows, out]
each, 4 bytes an element. So the forward makes few passes (no clamp; the scale multiplies write in place
where they can) and runs the matmul and its rescale ROW_TILE rows at a time, so each tile's products are
rescaled while still in cache (at 2048 rows: 40-45 ms per layer against 46-77 ms untiled). A whole W8A8
linear came to ~4.4x fp32's speed and ~1.2x bf16's at 512 rows. oneDNN's u8s8 qlinear with the weight
scales fused (torch.ops.onednn.qlinear_pointwise) measured the same within noise, so the oracle-checked
_int_mm stays.
"""
from __future__ import annotations

import torch
from torch import nn

_TINY = torch.finfo(torch.float32).tiny
ROW_TILE = 256  # rows per int8 matmul + rescale: SmolLM2's widest products (3072 wide) stay within L2


def quantize_rows_int8(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 per row: (codes [M, K] int8, scale [M, 1] fp32) with x ~ codes * scale. The codes
    need no clamp: the scale is a normal float (rounded by at most 2**-24), so |x| / scale < 127.5."""
    scale = x.abs().amax(dim=-1, keepdim=True).float().clamp_(min=127 * _TINY).div_(127.0)
    return torch.div(x.float(), scale).round_().to(torch.int8), scale


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
        weight_t = self.qweight.T
        out = torch.empty(flat.shape[0], weight_t.shape[1], dtype=torch.float32, device=x.device)
        for start in range(0, flat.shape[0], ROW_TILE):
            rows = slice(start, start + ROW_TILE)
            acc = torch._int_mm(codes[rows], weight_t)  # int32, exact: |sum| <= K * 127**2 < 2**31 for K < 2**17
            torch.mul(acc, x_scale[rows], out=out[rows]).mul_(self.weight_scale)
        if self.bias is not None:
            out.add_(self.bias)
        return out.to(x.dtype).view(*x.shape[:-1], out.shape[-1])
