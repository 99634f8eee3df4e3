"""Per-input-channel scales folded into a decoder layer without changing its function: a linear's input
channel j divided by s_j where it is produced, the linear's column j multiplied by s_j (SmoothQuant moves
activation outliers into the weights this way, AWQ protects the weights that read large activations).

Where each linear's input is produced:
- q/k/v and gate/up: the RMSNorm before them (its weight divided by s);
- o_proj: v's rows (attention mixes v linearly over tokens); with GQA each v channel feeds a group of
  o's channels, which then share one s;
- down_proj: up's rows (silu(gate) * up is linear in up).
"""
from __future__ import annotations

import torch

from ..models.llama import DecoderLayer


def fold(layer: DecoderLayer, name: str, s: torch.Tensor) -> None:
    """Folds `s` (one per input channel of linear `name`; for o_proj one per v channel, see
    o_channels) into the layer."""
    attn, mlp = layer.self_attn, layer.mlp
    if name == "self_attn.qkv_proj":
        layer.input_layernorm.weight.div_(s)
        attn.qkv_proj.weight.mul_(s)
    elif name == "mlp.gate_up_proj":
        layer.post_attention_layernorm.weight.div_(s)
        mlp.gate_up_proj.weight.mul_(s)
    elif name == "self_attn.o_proj":
        _divide_rows(attn.qkv_proj, slice(attn.q_size + attn.kv_size, attn.q_size + 2 * attn.kv_size), s)
        attn.o_proj.weight.mul_(expand_v(layer, s))
    elif name == "mlp.down_proj":
        _divide_rows(mlp.gate_up_proj, slice(len(s), 2 * len(s)), s)
        mlp.down_proj.weight.mul_(s)
    else:
        raise ValueError(f"no scale folds into {name}")


def _divide_rows(linear: torch.nn.Module, rows: slice, s: torch.Tensor) -> None:
    weight = linear.weight
    assert isinstance(weight, torch.Tensor)
    weight[rows] /= s[:, None]
    bias = getattr(linear, "bias", None)
    if isinstance(bias, torch.Tensor):
        bias[rows] /= s


def v_channels(layer: DecoderLayer, t: torch.Tensor, reduce: str = "amax") -> torch.Tensor:
    """A statistic of o_proj's input channels [heads * d] per v channel [kv_heads * d], over the GQA group
    that reads it (`amax` or `mean`): o's channels in a group share their v channel's scale."""
    attn = layer.self_attn
    grouped = t.view(attn.num_kv_heads, attn.num_heads // attn.num_kv_heads, attn.head_dim)
    return (grouped.amax(dim=1) if reduce == "amax" else grouped.mean(dim=1)).reshape(-1)


def expand_v(layer: DecoderLayer, s: torch.Tensor) -> torch.Tensor:
    """Per-v-channel scales [kv_heads * d] spread over o_proj's input channels [heads * d]."""
    attn = layer.self_attn
    groups = attn.num_heads // attn.num_kv_heads
    return s.view(attn.num_kv_heads, 1, attn.head_dim).expand(-1, groups, -1).reshape(-1)
