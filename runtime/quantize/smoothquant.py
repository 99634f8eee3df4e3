"""SmoothQuant (Xiao et al., 2023): divide each input channel j of a linear by s_j and multiply the
weights' column j by it, with s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), so activation outliers move
into the weights, where per-channel int8 absorbs them; then W8A8 (w8a8.W8A8Linear).

The division is folded into whatever produces X, so the smoothed fp model computes the same function:
- q/k/v and gate/up: into the RMSNorm weight before them;
- o_proj: into v's rows (attention mixes v linearly over tokens); with GQA each v channel feeds a group of
  o's channels, which then share one s (the max over the group);
- down_proj: into up's rows (silu(gate) * up is linear in up).
"""
from __future__ import annotations

import torch

from ..models.linear.w8a8 import quantize_rows_int8
from ..models.llama import DecoderLayer, LlamaForCausalLM
from .hf_writer import Packed
from .layerwise import LINEARS, linear_weight, record_inputs, run_layerwise

_MIN = 1e-5


def smoothing_scales(act_max: torch.Tensor, weight_max: torch.Tensor, alpha: float) -> torch.Tensor:
    s = act_max.clamp(min=_MIN).pow(alpha) / weight_max.clamp(min=_MIN).pow(1 - alpha)
    return s.clamp(min=_MIN)


def smooth_and_quantize(model: LlamaForCausalLM, samples: list[torch.Tensor], alpha: float | None) -> dict[str, Packed]:
    """Smooths the model in place (alpha None: not at all, plain W8A8), then per-output-channel int8 of
    every decoder linear: {module name: (int8 weights, scales [N, 1])}."""
    if alpha is not None:
        if not samples:
            raise ValueError("SmoothQuant needs calibration text (--calib)")
        smooth_model(model, samples, alpha)
    return {f"layers.{i}.{name}": quantize_rows_int8(linear_weight(layer, name).detach())
            for i, layer in enumerate(model.layers) for name in LINEARS}


@torch.no_grad()
def smooth_model(model: LlamaForCausalLM, samples: list[torch.Tensor], alpha: float) -> None:
    def on_layer(index: int, layer: DecoderLayer, run) -> None:
        act_max: dict[str, torch.Tensor] = {}

        def observe(name: str, x: torch.Tensor) -> None:
            m = x.abs().amax(dim=0).float()
            act_max[name] = torch.maximum(act_max[name], m) if name in act_max else m

        handles = record_inputs(layer, observe)
        run(None)
        for h in handles:
            h.remove()
        smooth_layer(layer, act_max, alpha)

    run_layerwise(model, samples, on_layer, desc="SmoothQuant")


def smooth_layer(layer: DecoderLayer, act_max: dict[str, torch.Tensor], alpha: float) -> None:
    attn, mlp = layer.self_attn, layer.mlp
    for norm, linear, name in ((layer.input_layernorm, attn.qkv_proj, "self_attn.qkv_proj"),
                               (layer.post_attention_layernorm, mlp.gate_up_proj, "mlp.gate_up_proj")):
        s = smoothing_scales(act_max[name], linear.weight.abs().amax(dim=0), alpha)
        norm.weight.div_(s)
        linear.weight.mul_(s)
    _smooth_v_into_o(layer, act_max["self_attn.o_proj"], alpha)
    _smooth_up_into_down(layer, act_max["mlp.down_proj"], alpha)


def _smooth_v_into_o(layer: DecoderLayer, act_max: torch.Tensor, alpha: float) -> None:
    attn = layer.self_attn
    groups, d = attn.num_heads // attn.num_kv_heads, attn.head_dim

    def per_v_channel(t: torch.Tensor) -> torch.Tensor:  # [heads * d] -> [kv_heads * d], max over the group
        return t.view(attn.num_kv_heads, groups, d).amax(dim=1).reshape(-1)

    w_max = attn.o_proj.weight.abs().amax(dim=0)
    s = smoothing_scales(per_v_channel(act_max), per_v_channel(w_max), alpha)
    v_rows = slice(attn.q_size + attn.kv_size, attn.q_size + 2 * attn.kv_size)
    attn.qkv_proj.weight[v_rows] /= s[:, None]
    if attn.qkv_proj.bias is not None:
        attn.qkv_proj.bias[v_rows] /= s
    attn.o_proj.weight.mul_(s.view(attn.num_kv_heads, 1, d).expand(-1, groups, -1).reshape(-1))


def _smooth_up_into_down(layer: DecoderLayer, act_max: torch.Tensor, alpha: float) -> None:
    mlp = layer.mlp
    s = smoothing_scales(act_max, mlp.down_proj.weight.abs().amax(dim=0), alpha)
    up_rows = slice(len(s), 2 * len(s))
    mlp.gate_up_proj.weight[up_rows] /= s[:, None]
    if mlp.gate_up_proj.bias is not None:
        mlp.gate_up_proj.bias[up_rows] /= s
    mlp.down_proj.weight.mul_(s)
