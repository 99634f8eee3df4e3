"""AWQ (Lin et al., 2024): activation-aware weight quantization. The few weights that read large
activations matter most; scaling input channel j of a linear up by s_j before rounding (and its input down
by s_j where it is produced, scales.py) rounds those weights with a relatively finer grid.

Per linear, s = mean|x|^a / sqrt(max * min) (normalised so the scales straddle 1) for a in ALPHA_GRID,
and the a kept is the largest one whose rounded weights give an output error on the calibration inputs
within ALPHA_TOLERANCE of the least,
||X (W - Q(W s) / s)^T||^2 = sum((W - Q(W s) / s) H * (W - Q(W s) / s)) with H = X^T X: exact over every
calibration token at the cost of one [N, K] x [K, K] product per trial. a = 0 (s = 1) is plain
round-to-nearest. The error is flat near its least, and among near-ties the stronger scaling
generalised better (it protects the salient channels on inputs the calibration did not see: dev
perplexity 28.060 -> 27.506, held-out long / story 15.611 / 30.812 -> 15.599 / 30.101, mean KL from fp32
lower on all three; docs/models.md). Then each scaled
linear is rounded (GPTQ's quantizer, without error feedback) with each group's range clipped to the least
output error over the calibration tokens, as AWQ's own clip search measures it: ||X_g (W_g - Q(W_g))^T||^2
through the group's whole block of H, its inputs' correlations included, and each row's (scale, zero) then
refitted to its codes by least squares on that error (gptq.refit_params; on the development text the
block rounded better than the diagonal alone, and the refit better still; scaling by mean |w| too,
AutoAWQ's "duo" scales, rounded worse, and choosing the scales by the attention block's or the MLP's
output gained nothing at 3x the time: docs/models.md). q, k and v share one s (qkv_proj is one fused linear, searched as one), as gate and up do.

As in AWQ, the statistics of every layer come from the fp model (scaling keeps each layer's function, so
one pass per layer calibrates it and gives the next its inputs); o_proj's scales are one per v channel
(the GQA group of o's channels that reads it shares it).
"""
from __future__ import annotations

import torch

from ..models.linear.quant_formats import IntWeight
from ..models.llama import DecoderLayer, LlamaForCausalLM
from .gptq import GPTQSpec, rtn_quantize
from .layerwise import LINEARS, linear_weight, record_inputs, run_layerwise
from .scales import expand_v, fold, v_channels

ALPHA_GRID = tuple(i / 20 for i in range(20))  # 0, 0.05, ..., 0.95, as AWQ's grid of 20
ALPHA_TOLERANCE = 0.02  # the largest a whose calibration output error is within 2% of the least is kept


def search_scales(weight: torch.Tensor, hessian: torch.Tensor, act_mean: torch.Tensor, spec: GPTQSpec,
                  expand=lambda s: s) -> tuple[torch.Tensor, float]:
    """(s, alpha): the per-channel scales of ALPHA_GRID, the largest alpha whose output error of `weight`
    [N, K] rounded (spec, no clip search) is within ALPHA_TOLERANCE of the least, on inputs of second
    moment `hessian` = X^T X [K, K] and mean |x| `act_mean` (one per scale; `expand` maps the scales onto
    the K input channels)."""
    plain = GPTQSpec(spec.bits, spec.group_size, spec.sym)
    tried: list[tuple[float, float, torch.Tensor]] = []
    for alpha in ALPHA_GRID:
        s = act_mean.clamp(min=1e-4).pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        cols = expand(s)
        err = weight - rtn_quantize(weight * cols, plain).dequantize() / cols
        tried.append((float(((err @ hessian) * err).sum()), alpha, s))
    least = min(loss for loss, _, _ in tried)
    _, alpha, s = max((t for t in tried if t[0] <= (1 + ALPHA_TOLERANCE) * least), key=lambda t: t[1])
    return s, alpha


def awq_layers(model: LlamaForCausalLM, samples: list[torch.Tensor], spec: GPTQSpec) -> dict[str, IntWeight]:
    """Scales folded into the model in place, then every decoder linear rounded: {module name: codes}."""
    if not samples:
        raise ValueError("AWQ needs calibration text (--calibration)")
    packed: dict[str, IntWeight] = {}

    def on_layer(index: int, layer: DecoderLayer, run) -> None:
        hessians: dict[str, torch.Tensor] = {}
        sums: dict[str, torch.Tensor] = {}
        rows = 0

        def observe(name: str, x: torch.Tensor) -> None:
            nonlocal rows
            x = x.float()
            if name not in hessians:
                hessians[name], sums[name] = x.T @ x, x.abs().sum(dim=0)
            else:
                hessians[name].addmm_(x.T, x)
                sums[name] += x.abs().sum(dim=0)
            rows += len(x) * (name == LINEARS[0])

        handles = record_inputs(layer, observe)
        run(None)
        for h in handles:
            h.remove()
        scales = {}
        for name in LINEARS:  # every search on the layer as its input statistics saw it, then the folds
            weight = linear_weight(layer, name).detach()
            mean = sums[name] / rows
            if name == "self_attn.o_proj":
                s, _ = search_scales(weight, hessians[name], v_channels(layer, mean, "mean"), spec,
                                     expand=lambda v: expand_v(layer, v))
                scales[name] = (s, expand_v(layer, s))
            else:
                s, _ = search_scales(weight, hessians[name], mean, spec)
                scales[name] = (s, s)
        for name, (s, _) in scales.items():
            fold(layer, name, s)
        for name, (_, cols) in scales.items():  # the inputs are now x / s: H becomes diag(1/s) H diag(1/s)
            importance = hessians[name] / rows / cols[:, None] / cols[None, :]
            weight = linear_weight(layer, name).detach()
            packed[f"layers.{index}.{name}"] = rtn_quantize(weight, spec, importance, refit=True)

    run_layerwise(model, samples, on_layer, desc="AWQ", same_function=True)
    return packed
