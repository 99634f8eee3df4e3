"""Quantized linears on GPU: GPTQ / AWQ codes run on the Triton dequant-GEMM (kernels/triton/dequant_gemm.py),
W8A8 int8 on the Triton int8 GEMM (kernels/triton/w8a8.py).

At load the group-sorted IntWeight (checkpoint_quant sorts act-order columns and gathers the input) is
packed along K into int32 words, GPTQ's qweight layout, whatever format it came from; scales become fp32
(the stored fp16 values, exactly) and zeros int16 (8-bit v1 zeros reach 256), both [groups, N], so a K
step reads one row of each. A W8A8 linear keeps w8a8.W8A8Linear's int8 [N, K] weights and fp32 channel
scales as they are; only its forward differs.
"""
from __future__ import annotations

import torch
from torch import nn

from .quant_formats import IntWeight, pack_int32
from .w8a8 import W8A8Linear


class TritonIntLinear(nn.Module):
    """y = x W^T + b with W = IntWeight.dequantize(), computed from the packed codes."""

    qweight: torch.Tensor  # buffers (registered in __init__, so they move and save with the module)
    scales: torch.Tensor
    zeros: torch.Tensor
    g_idx: torch.Tensor

    def __init__(self, w: IntWeight, bias: torch.Tensor | None, device: torch.device):
        super().__init__()
        self.bits = w.bits
        self.register_buffer("qweight", pack_int32(w.codes.T, w.bits, dim=0).to(device))
        self.register_buffer("scales", w.scales.float().T.contiguous().to(device))
        self.register_buffer("zeros", w.zeros.T.to(torch.int16).contiguous().to(device))
        self.register_buffer("g_idx", w.g_idx.to(torch.int32).to(device))
        self.bias = None if bias is None else nn.Parameter(bias.detach().to(device), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ....kernels.triton.dequant_gemm import dequant_gemm

        flat = x.reshape(-1, x.shape[-1])
        out = dequant_gemm(flat, self.qweight, self.scales, self.zeros, self.g_idx, self.bits, self.bias)
        return out.view(*x.shape[:-1], out.shape[-1])


class TritonW8A8Linear(W8A8Linear):
    """W8A8Linear on the GPU: per-token int8 activations and the int8 GEMM with its rescale, in Triton."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from ....kernels.triton.w8a8 import w8a8_linear

        flat = x.reshape(-1, x.shape[-1])
        out = w8a8_linear(flat, self.qweight, self.weight_scale, self.bias)
        return out.view(*x.shape[:-1], out.shape[-1])
