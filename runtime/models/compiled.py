"""Optional torch.compile of the decode forward on the CPU, as gpt-fast compiles its decode step.

Eager decode at batch 1 makes ~185 aten calls per layer (views included) around the matmuls; inductor
fuses the norms, residual adds, casts, RoPE and SiLU * up into a few C++ loops and calls the packed
matmuls and attention as external kernels. Measured on SmolLM2 with `quantization="auto"`, one thread, a loaded 2-core VM: the
model step takes ~0.6x the eager step's CPU time, after ~85-120 s of compiling (wall) per graph: one
compiles on the first decode step of batch 1, of larger batches, and of batches whose lengths differ.
So it is off by default (EngineConfig.compile_layers) and kept out of the tests. Steps holding prompt
chunks or token trees run eagerly: their shapes (one attention call per sequence) change every step.
"""
from __future__ import annotations

import torch

from .llama import ForwardContext, LlamaForCausalLM


def compile_layers(model: LlamaForCausalLM) -> None:
    """Routes the model's decode-only steps (one new token per sequence, no image embeddings) through
    one torch.compile'd forward with dynamic batch and KV lengths."""
    eager = model.forward
    compiled = torch.compile(eager, dynamic=True)

    def forward(input_ids: torch.Tensor, positions: torch.Tensor, ctx: ForwardContext,
                embeds: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
        if embeds is None and getattr(ctx.attn, "decode_only", False):
            return compiled(input_ids, positions, ctx)
        return eager(input_ids, positions, ctx, embeds)

    model.forward = forward
