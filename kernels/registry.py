"""Attention backends by name: the `attention_backend` engine option picks one."""
from __future__ import annotations

import importlib.util
from typing import Callable

import torch

from .backend import AttentionBackend
from .kv_quant import KVScales
from .reference import TorchAttention

BackendFactory = Callable[[list[torch.Tensor], list[torch.Tensor], KVScales | None], AttentionBackend]



def _triton(k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor],
            scales: KVScales | None = None) -> AttentionBackend:
    from .triton.backend import TritonAttention

    return TritonAttention(k_buffers, v_buffers, scales)


ATTENTION_BACKENDS: dict[str, BackendFactory] = {"torch": TorchAttention}
# Triton runs on CUDA, and on the CPU only under TRITON_INTERPRET=1 (the tests); where no wheel exists
# for the platform, the torch reference serves every device
if importlib.util.find_spec("triton") is not None:
    ATTENTION_BACKENDS["triton"] = _triton


def resolve_backend(name: str, device: torch.device) -> str:
    """'auto': Triton on CUDA where it is installed, else the torch reference."""
    if name == "auto":
        return "triton" if device.type == "cuda" and "triton" in ATTENTION_BACKENDS else "torch"
    if name not in ATTENTION_BACKENDS:
        raise ValueError(f"attention_backend must be 'auto' or one of {sorted(ATTENTION_BACKENDS)}, got {name!r}")
    return name


def create_backend(name: str, k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor],
                   scales: KVScales | None = None) -> AttentionBackend:
    """`scales`: a quantized pool's (kernels/kv_quant.py), whose buffers hold codes."""
    return ATTENTION_BACKENDS[resolve_backend(name, k_buffers[0].device)](k_buffers, v_buffers, scales)
