"""SmoothQuant (Xiao et al., 2023): divide each input channel j of a linear by s_j and multiply the
weights' column j by it, with s_j = max|X_j|^alpha / max|W_j|^(1 - alpha), so activation outliers move
into the weights, where per-channel int8 absorbs them; then W8A8 (w8a8.W8A8Linear: per-output-channel
int8 weights, per-token dynamic int8 activations). The scales fold into the layer (scales.py).

alpha is searched per layer: for each alpha of ALPHAS the layer is smoothed, its W8A8 simulated (weights
rounded per channel, every linear's input rounded per token as the engine does), and run on the first
calibration samples (at most SEARCH_TOKENS tokens); the alpha whose outputs are nearest the fp layer's
(mean squared error) is kept. One alpha for the whole model fits no model well: the layers' outliers differ.

down_proj's input (silu(gate) * up) keeps a few huge channels after smoothing, and per-token int8 of it was
most of W8A8's cost on SmolLM2. With `rotate` its weights become W H^T, H an orthonormal Hadamard matrix,
and the engine rotates its input by H before rounding it (models/linear/hadamard.py): the huge channels
spread over all 1536, the row's scale falls, and the rounding with it. The alpha trials simulate that
rotation too. On the development text (alpha 0.5, simulated W8A8) it took W8A8's perplexity cost from
+1.28% to +0.09% (a block-diagonal rotation of 128-channel blocks: +0.39%).
"""
from __future__ import annotations

from typing import Callable

import torch

from ..models.linear.hadamard import HadamardInput
from ..models.linear.w8a8 import quantize_rows_int8
from ..models.llama import DecoderLayer, LlamaForCausalLM
from .hf_writer import Packed
from .layerwise import LINEARS, linear_weight, record_inputs, run_layerwise
from .scales import fold, v_channels

_MIN = 1e-5
ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # the paper's useful range (0.5 for most models, up to 0.8-0.85)
SEARCH_TOKENS = 4096  # calibration tokens each alpha's trial runs on


def smoothing_scales(act_max: torch.Tensor, weight_max: torch.Tensor, alpha: float) -> torch.Tensor:
    s = act_max.clamp(min=_MIN).pow(alpha) / weight_max.clamp(min=_MIN).pow(1 - alpha)
    return s.clamp(min=_MIN)


def smooth_and_quantize(model: LlamaForCausalLM, samples: list[torch.Tensor],
                        alpha: float | None | str, keep_fp: int = 0, rotate: bool = False) -> dict[str, Packed]:
    """Smooths the model in place (alpha: one for every layer; "search": each layer's own; None: no
    smoothing, plain W8A8), then per-output-channel int8 of every decoder linear: {module name: (int8
    weights, scales [N, 1])}. With `rotate` every down_proj's weights become W H^T first (its input is
    to be rotated by H at run time). The down_proj of the `keep_fp` layers where its W8A8 error weighs most
    (down_shares) is left out: it stays in the model's dtype (rotated all the same)."""
    shares: list[float] = []
    rotator = down_rotation(model) if rotate else None
    if alpha is not None:
        if not samples:
            raise ValueError("SmoothQuant needs calibration text (--calibration)")
        shares = smooth_model(model, samples, alpha, measure_down=keep_fp > 0, rotator=rotator)[1]
    if rotator is not None:
        with torch.no_grad():
            for layer in model.layers:
                weight = linear_weight(layer, "mlp.down_proj")
                weight.copy_(rotator.rotate(weight))  # row r of W H^T is H W[r]
    kept = {f"layers.{i}.mlp.down_proj" for i in sorted(range(len(shares)), key=shares.__getitem__)[len(shares) - keep_fp:]}
    return {f"layers.{i}.{name}": quantize_rows_int8(linear_weight(layer, name).detach())
            for i, layer in enumerate(model.layers) for name in LINEARS if f"layers.{i}.{name}" not in kept}


def down_rotation(model: LlamaForCausalLM) -> HadamardInput:
    """The rotation of down_proj's input, as the engine applies it."""
    return HadamardInput(model.config.intermediate_size, torch.nn.Identity())


@torch.no_grad()
def smooth_model(model: LlamaForCausalLM, samples: list[torch.Tensor], alpha: float | str,
                 measure_down: bool = False, rotator: HadamardInput | None = None) -> tuple[list[float], list[float]]:
    """Smooths every layer with `alpha`, or ("search") with the best of ALPHAS for it; returns the alphas
    and (with `measure_down`) each layer's down share: how much of the layer's simulated W8A8 output
    error, relative to its output's mean square, goes away with down_proj left in fp. `rotator`: the
    trials simulate down_proj on rotated inputs (smooth_and_quantize's `rotate`)."""
    chosen: list[float] = []
    shares: list[float] = []
    trial = _search_prefix(samples)

    def on_layer(index: int, layer: DecoderLayer, run) -> None:
        act_max: dict[str, torch.Tensor] = {}

        def observe(name: str, x: torch.Tensor) -> None:
            m = x.abs().amax(dim=0).float()
            act_max[name] = torch.maximum(act_max[name], m) if name in act_max else m

        handles = record_inputs(layer, observe)
        fp_outputs = run(None)
        for h in handles:
            h.remove()
        if alpha == "search":
            errors = {a: _w8a8_error(layer, act_max, a, run, fp_outputs[:trial], rotator=rotator) for a in ALPHAS}
            chosen.append(min(errors, key=errors.__getitem__))
        else:
            chosen.append(float(alpha))
        if measure_down:
            reference = fp_outputs[:trial]
            scale = sum(float(r.square().sum()) for r in reference) / sum(r.numel() for r in reference)
            whole = errors[chosen[-1]] if alpha == "search" else _w8a8_error(layer, act_max, chosen[-1], run,
                                                                             reference, rotator=rotator)
            shares.append((whole - _w8a8_error(layer, act_max, chosen[-1], run, reference, LINEARS[:3])) / scale)
        smooth_layer(layer, act_max, chosen[-1])

    run_layerwise(model, samples, on_layer, desc="SmoothQuant", same_function=True)
    return chosen, shares


def _search_prefix(samples: list[torch.Tensor]) -> int:
    """How many leading samples the alpha trials run on (at least one)."""
    total = 0
    for n, s in enumerate(samples):
        total += len(s)
        if total >= SEARCH_TOKENS:
            return n + 1
    return len(samples)


def _w8a8_error(layer: DecoderLayer, act_max: dict[str, torch.Tensor], alpha: float,
                run: Callable[..., list[torch.Tensor]], reference: list[torch.Tensor],
                quantized: tuple[str, ...] = LINEARS, rotator: HadamardInput | None = None) -> float:
    """Mean squared error of the layer's outputs, smoothed with `alpha` and its linears `quantized` run
    in simulated W8A8 (down_proj on inputs rotated by `rotator`, with weights W H^T, where given), against
    `reference` (the fp layer's outputs of the first samples); the layer is left as it was."""
    saved = {k: v.clone() for k, v in layer.state_dict().items()}
    smooth_layer(layer, act_max, alpha)
    handles = []
    for name in quantized:
        weight = linear_weight(layer, name)
        hook: Callable[[torch.nn.Module, tuple], tuple] = _round_input_rows
        if rotator is not None and name == "mlp.down_proj":
            weight.copy_(rotator.rotate(weight))
            hook = _rotated_rounder(rotator)
        codes, scale = quantize_rows_int8(weight)
        weight.copy_(codes.float() * scale)
        handles.append(layer.get_submodule(name).register_forward_pre_hook(hook))
    try:
        outputs = run(None, len(reference))
    finally:
        for h in handles:
            h.remove()
        layer.load_state_dict(saved)
    return sum(float((o - r).square().sum()) for o, r in zip(outputs, reference)) / sum(r.numel() for r in reference)


def _round_input_rows(module: torch.nn.Module, args: tuple) -> tuple:
    codes, scale = quantize_rows_int8(args[0])
    return (codes.float() * scale,)


def _rotated_rounder(rotator: HadamardInput) -> Callable[[torch.nn.Module, tuple], tuple]:
    return lambda module, args: _round_input_rows(module, (rotator.rotate(args[0]),))


def smooth_layer(layer: DecoderLayer, act_max: dict[str, torch.Tensor], alpha: float) -> None:
    for name in ("self_attn.qkv_proj", "mlp.gate_up_proj", "mlp.down_proj"):
        fold(layer, name, smoothing_scales(act_max[name], linear_weight(layer, name).abs().amax(dim=0), alpha))
    o_max = linear_weight(layer, "self_attn.o_proj").abs().amax(dim=0)
    fold(layer, "self_attn.o_proj",
         smoothing_scales(v_channels(layer, act_max["self_attn.o_proj"]), v_channels(layer, o_max), alpha))
