"""Calibration forward passes one decoder layer at a time: the samples' hidden states go through layer i,
a callback sees the inputs of its linears (and may change its weights), then the layer runs again to give
layer i + 1 its inputs. Only one layer's activations are held (samples x tokens x hidden, plus the
layer's intermediates), whatever the depth."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..models.llama import DecoderLayer, ForwardContext, LlamaForCausalLM, RopeTable

LINEARS = ("self_attn.qkv_proj", "self_attn.o_proj", "mlp.gate_up_proj", "mlp.down_proj")


class CausalAttention:
    """The attention backend of a calibration pass: one whole sequence, causal, nothing cached."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer_id: int, scale: float) -> torch.Tensor:
        groups = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        out = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                             is_causal=True, scale=scale)
        return out.transpose(0, 1)

    def forward_latent(self, q_nope: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor, layer_id: int,
                       scale: float, w_kv_b: torch.Tensor) -> torch.Tensor:
        raise ValueError("layer-wise calibration runs multi-head attention models, not MLA (DeepSeek) ones")


def linear_weight(module: torch.nn.Module, name: str) -> torch.Tensor:
    """The weight of `module`'s linear `name` (`get_submodule`'s typing knows no linear)."""
    weight = module.get_submodule(name).weight
    assert isinstance(weight, torch.Tensor), f"{name} is a linear, with a weight"
    return weight


def record_inputs(layer: DecoderLayer, observe: Callable[[str, torch.Tensor], None],
                  names: tuple[str, ...] = LINEARS) -> list:
    """Calls observe(linear name, its 2-D input) on every forward of the layer's linears `names`; returns
    the hook handles (remove them when done)."""
    def hook(name):
        return lambda module, args: observe(name, args[0].reshape(-1, args[0].shape[-1]))

    return [layer.get_submodule(name).register_forward_pre_hook(hook(name)) for name in names]


class _InputSeen(Exception):
    """Raised by a hook once the linear a pass is for has seen its input (args[0]): the rest of the layer
    is not run."""


SAVED = ("self_attn.o_proj", "mlp.down_proj")  # linears whose inputs a whole pass stopped there keeps


def stream_start(model: LlamaForCausalLM,
                 samples: list[torch.Tensor]) -> tuple[list[torch.Tensor], list[RopeTable], ForwardContext]:
    """The samples' hidden states before the first layer, their rotary tables, and the causal context."""
    return ([model.embed_tokens(ids) for ids in samples], [model.rotary.table(torch.arange(len(ids))) for ids in samples],
            ForwardContext(attn=CausalAttention()))


@torch.no_grad()
def run_layerwise(model: LlamaForCausalLM, samples: list[torch.Tensor],
                  on_layer: Callable[[int, DecoderLayer, Callable[..., list[torch.Tensor]]], None], desc: str,
                  same_function: bool = False) -> None:
    """For each layer: on_layer(index, layer, run), where run(stop_at, samples=None) passes every sample
    (or the first `samples`) through the layer as it is at that moment (hook its linears to see their
    inputs), up to linear `stop_at`'s input when given (what comes after it is not computed), and returns
    the layer's outputs (none when stopped); then the samples move on through the layer as on_layer left
    it. With `same_function` on_layer only reparametrises the layer (folds scales: AWQ, SmoothQuant), so
    the outputs of its last whole pass (run(None)) move on and the layer is not run again.

    A pass stopped in the MLP starts from x + attention(x) saved by the first such pass, and the samples
    move on from it too, so on_layer must be done with the attention linears when it first stops in the
    MLP (GPTQ's forward order is). That halves the layer passes of true-sequential GPTQ. A whole pass
    stopped at o_proj or down_proj keeps that linear's inputs (SAVED), and what follows starts from them:
    x + attention(x) is x + o_proj(its saved input), the samples move on as x + down_proj(its saved
    input), rather than running again the attention or gate/up that gave them; so after such a pass
    on_layer may change that linear's weights only (GPTQ's order: each linear is quantized after its own
    pass). The same operations on the same values, so the same results (GPTQ's codes bit for bit), with each
    matmul of the layer run once rather than up to five times: the passes took ~30% less CPU time, for
    holding those inputs (tokens x (hidden + intermediate) floats: ~0.4 GB for SmolLM2-135M on 51k tokens)."""
    hidden, ropes, ctx = stream_start(model, samples)
    whole: list[torch.Tensor] = []  # the last whole pass's outputs, over every sample
    mid: list[torch.Tensor] = []  # x + attention(x) per sample, once a pass stops in the MLP
    saved: dict[str, list[torch.Tensor]] = {}  # a SAVED linear's input per sample, from a whole pass stopped at it

    def run(stop_at: str | None, samples: int | None = None) -> list[torch.Tensor]:
        handle = None
        if stop_at is not None:
            def stop(module: torch.nn.Module, args: tuple) -> None:
                raise _InputSeen(args[0])

            # registered last: the caller's hook on the same linear sees the input first
            handle = layer.get_submodule(stop_at).register_forward_pre_hook(stop)
        outputs, inputs = [], []
        try:
            for i, (x, rope) in enumerate(zip(hidden[:samples], ropes)):
                try:
                    outputs.append(half(stop_at, i, x, rope))
                except _InputSeen as seen:
                    inputs.append(seen.args[0])
        finally:
            if handle is not None:
                handle.remove()
        if stop_at in SAVED and len(inputs) == len(hidden):
            saved[stop_at] = inputs
        if samples is None and len(outputs) == len(hidden):
            whole[:] = outputs
        return outputs

    def half(stop_at: str | None, i: int, x: torch.Tensor, rope) -> torch.Tensor:
        """DecoderLayer.forward in its two halves: a pass that stops in the MLP starts from the attention
        half's output, computed once (by then the callback has finished with the attention linears)."""
        if stop_at is None:
            return layer(x, rope, ctx)
        if stop_at.startswith("self_attn."):
            return layer.self_attn(layer.input_layernorm(x), rope, ctx)
        if len(mid) == i:
            attention_out = saved.get("self_attn.o_proj")
            mid.append(x + (layer.self_attn.o_proj(attention_out[i]) if attention_out is not None
                            else layer.self_attn(layer.input_layernorm(x), rope, ctx)))
        return layer.mlp(layer.post_attention_layernorm(mid[i]))

    for index, layer in enumerate(tqdm(model.layers, desc=desc, unit="layer")):
        whole.clear()
        mid.clear()
        saved.clear()
        on_layer(index, layer, run)
        if same_function and whole:
            hidden = whole[:]
        elif len(mid) == len(hidden) and "mlp.down_proj" in saved:  # down_proj on its saved inputs
            hidden = [h + layer.mlp.down_proj(d) for h, d in zip(mid, saved.pop("mlp.down_proj"))]
        elif len(mid) == len(hidden):  # the MLP half on the attention half's saved output
            hidden = [h + layer.mlp(layer.post_attention_layernorm(h)) for h in mid]
        else:
            hidden = [layer(x, rope, ctx) for x, rope in zip(hidden, ropes)]


class FloatStream:
    """The samples' hidden states through the model as it was before quantizing (GPTQ's asymmetric
    calibration: the fp model's outputs on fp inputs are the target). `inputs(layer)`, called with layer i
    still in fp, gives each linear's per-sample fp inputs and moves the stream on through the layer."""

    def __init__(self, model: LlamaForCausalLM, samples: list[torch.Tensor]):
        with torch.no_grad():
            self.hidden, self.ropes, self.ctx = stream_start(model, samples)

    @torch.no_grad()
    def inputs(self, layer: DecoderLayer) -> dict[str, list[torch.Tensor]]:
        seen: dict[str, list[torch.Tensor]] = {name: [] for name in LINEARS}
        handles = record_inputs(layer, lambda name, x: seen[name].append(x.float()))
        try:
            self.hidden = [layer(x, rope, self.ctx) for x, rope in zip(self.hidden, self.ropes)]
        finally:
            for h in handles:
                h.remove()
        return seen
