"""Optional torch.compile of the decoder's elementwise-heavy parts (MLP, RMSNorms) for CPU decode.

Inductor fuses SiLU * up and each RMSNorm into C++ loops around the packed matmuls. Measured on SmolLM2
with `quantization="auto"` at batch 1: ~1.09x the eager step, after ~100 s of compiling on a loaded 2-core
VM, so it is off by default (EngineConfig.compile_layers) and kept out of the tests. Attention stays eager:
its shapes change every step.
"""
from __future__ import annotations

import torch
from torch import nn


def compile_layers(model: nn.Module) -> None:
    """Wraps each decoder layer's MLP and norms in torch.compile (dynamic shapes: one graph for any batch)."""
    for layer in model.layers:
        layer.mlp = torch.compile(layer.mlp, dynamic=True)
        layer.input_layernorm = torch.compile(layer.input_layernorm, dynamic=True)
        layer.post_attention_layernorm = torch.compile(layer.post_attention_layernorm, dynamic=True)
