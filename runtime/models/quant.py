"""Weight-only int8 linears for CPU decode: each output channel's weights as int8 with one scale.

At batch 1 a decode step reads every weight once, so its time is the bytes read: int8 reads a quarter
of fp32's. torch's int8pack kernel is fast only with bf16 activations, so inputs are cast to bf16 for
the matmul and the result back to the model's dtype. Outputs then differ slightly from the fp32 model,
which stays the default and the oracle (`quantization="none"`).
"""
from __future__ import annotations

import torch
from torch import nn

QUANTIZATIONS = ("none", "int8")
K_MULTIPLE = 64  # torch 2.13's CPU int8pack kernel crashes on some other input widths (K=40 with M>=5)


class Int8Linear(nn.Module):
    """y = x W^T + b with W = qweight * scale[:, None] (symmetric, per output channel)."""

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127.0
        self.register_buffer("qweight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.bias = None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)

    def dequantized(self) -> torch.Tensor:
        """The weights this layer computes with, in fp32."""
        return self.qweight.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        out = torch.ops.aten._weight_int8pack_mm(flat, self.qweight, self.scale).to(x.dtype)
        out = out.view(*x.shape[:-1], out.shape[-1])
        return out if self.bias is None else out + self.bias


def quantize_int8(model: nn.Module) -> None:
    """Replaces every nn.Linear of `model` whose input width is a multiple of K_MULTIPLE, in place (the
    rest stay fp32); a tied LM head gets an int8 copy of the embedding."""
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            if isinstance(child, nn.Linear) and child.in_features % K_MULTIPLE == 0:
                setattr(module, name, Int8Linear(child.weight, child.bias))
    embed = getattr(model, "embed_tokens", None)
    if getattr(model, "lm_head", False) is None and embed.embedding_dim % K_MULTIPLE == 0:
        model.lm_head = Int8Linear(embed.weight, None)  # tied: the embedding itself stays fp32 for lookups


