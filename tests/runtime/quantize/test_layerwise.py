"""Layer-wise calibration passes see exactly what the model's own forward gives each linear: whether a pass
stops at a linear's input, starts from the saved attention half or a linear's saved inputs, or
(same_function) hands its outputs on; also when each linear changes after its own pass, as GPTQ's do."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers

from radixlang.runtime.model_loading import load_model
from radixlang.runtime.models.llama import ForwardContext
from radixlang.runtime.quantize.layerwise import (
    LINEARS,
    CausalAttention,
    FloatStream,
    linear_weight,
    record_inputs,
    run_layerwise,
)

from ..models.hf_tiny import BASE, save_hf_model

SAMPLES = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)) for n in (20, 33)]


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    path = tmp_path_factory.mktemp("lw") / "llama"
    save_hf_model(path, transformers.LlamaConfig(**BASE), seed=8)
    return load_model(path, torch.device("cpu"), torch.float32).model


@torch.no_grad()
def forward_inputs(model) -> dict[tuple[int, str], list[torch.Tensor]]:
    """Each linear's input per sample, from the model's own forward (the oracle)."""
    seen: dict[tuple[int, str], list[torch.Tensor]] = {}
    handles = [h for i, layer in enumerate(model.layers)
               for h in record_inputs(layer, lambda name, x, i=i: seen.setdefault((i, name), []).append(x.clone()))]
    for ids in SAMPLES:
        model(ids, torch.arange(len(ids)), ForwardContext(attn=CausalAttention()))
    for h in handles:
        h.remove()
    return seen


@pytest.mark.parametrize("same_function", [False, True])
def test_every_pass_sees_the_inputs_of_the_models_own_forward(model, same_function):
    want = forward_inputs(model)
    got: dict[tuple[int, str], list[torch.Tensor]] = {}

    def whole_pass(index, layer, run) -> None:  # one whole pass, its outputs handed on
        handles = record_inputs(layer, lambda name, x: got.setdefault((index, name), []).append(x.clone()))
        run(None)
        for h in handles:
            h.remove()

    run_layerwise(model, SAMPLES, whole_pass if same_function else per_linear_passes(got), desc="test",
                  same_function=same_function)
    assert_same_inputs(got, want)


def per_linear_passes(got: dict, after=lambda layer, name, index: None):
    """on_layer: one pass per linear, stopped at its input, in forward order, its inputs recorded in `got`;
    then `after(layer, name, index)`."""
    def on_layer(index, layer, run) -> None:
        for name in LINEARS:
            handles = record_inputs(layer, lambda _, x, name=name: got.setdefault((index, name), []).append(x.clone()),
                                    names=(name,))
            run(name)
            for h in handles:
                h.remove()
            after(layer, name, index)
    return on_layer


def assert_same_inputs(got: dict, want: dict) -> None:
    assert got.keys() == want.keys()
    for key, xs in want.items():
        assert all(torch.allclose(a, b, atol=1e-5) for a, b in zip(got[key], xs, strict=True)), key


def nudge(layer, name: str, index: int) -> None:
    """A fixed change of a linear's weights (what GPTQ's rounding does after the linear's pass)."""
    weight = linear_weight(layer, name)
    noise = torch.randn(weight.shape, generator=torch.Generator().manual_seed(index * 10 + LINEARS.index(name)))
    with torch.no_grad():
        weight.add_(0.05 * noise)


def test_linears_changed_after_their_own_pass_give_the_later_ones_the_changed_models_inputs(model):
    """GPTQ's true-sequential order: each linear changes after its pass, so every later linear (in this layer
    and the next ones) must see the inputs of the model with the earlier ones changed: the oracle is the own
    forward of a copy whose every linear was changed first. The passes that start from saved inputs (o_proj's,
    down_proj's) must not hand on stale ones."""
    changed, oracle = copy.deepcopy(model), copy.deepcopy(model)
    for index, layer in enumerate(oracle.layers):
        for name in LINEARS:
            nudge(layer, name, index)
    want = forward_inputs(oracle)
    got: dict[tuple[int, str], list[torch.Tensor]] = {}
    run_layerwise(changed, SAMPLES, per_linear_passes(got, after=nudge), desc="test")
    assert_same_inputs(got, want)


def test_the_float_stream_gives_the_unchanged_models_inputs_while_the_passes_change_it(model):
    """GPTAQ's target inputs: FloatStream.inputs(layer), called before on_layer changes the layer, gives
    each linear the inputs of the unchanged model's own forward (the oracle), however the passes change
    the weights after."""
    want, changed = forward_inputs(model), copy.deepcopy(model)
    stream = FloatStream(changed, SAMPLES)
    got: dict[tuple[int, str], list[torch.Tensor]] = {}
    passes = per_linear_passes({}, after=nudge)

    def on_layer(index, layer, run) -> None:
        for name, xs in stream.inputs(layer).items():
            got[(index, name)] = xs
        passes(index, layer, run)

    run_layerwise(changed, SAMPLES, on_layer, desc="test")
    assert_same_inputs(got, want)
