"""GPTQ / AWQ folders: the loader's dequantised weights against each format's reference dequantisation
(bit-equal in fp16), each native layer against a matmul with those weights (bf16 bounds), a whole engine
against transformers running the reference weights, and bad quantization_config values.

The formats' reference formulas are written out in quant_folders.py. AutoAWQ's own dequantize_gemm is a
second oracle where it is installed: `pip install --no-deps autoawq` builds (pure Python), and its
packing_utils needs only torch, though the package's __init__ needs accelerate and a GPU stack, so the
test loads that one file. gptqmodel's sdist needs a CUDA toolchain to build: not tried here."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file

from radixlang.kernels.registry import ATTENTION_BACKENDS
from radixlang.runtime.engine import Engine
from radixlang.runtime.model_loading import load_model
from radixlang.runtime.models.linear.checkpoint_quant import (
    ConcatOutputs,
    PermutedInput,
    QuantStore,
    checkpoint_kernels,
    dequantized_weights,
    pack_checkpoint_linears,
    parse_quant_config,
)
from radixlang.runtime.models.linear.quant import Int4Linear
from radixlang.runtime.models.linear.quant_formats import IntWeight, read_gptq, write_gptq
from radixlang.runtime.models.linear.triton_quant import TritonIntLinear

from .hf_tiny import BASE, save_hf_model
from .quant_folders import write_quantized_folder
from .test_quant import bf16_bound

CASES = {  # name: (method, bits, group_size, act_order)
    "gptq4-g32-act-order": ("gptq", 4, 32, True),
    "gptq8-row": ("gptq", 8, -1, False),
    "awq4-g32": ("awq", 4, 32, False),
}


@pytest.fixture(scope="module")
def fp_folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("fp") / "llama"
    save_hf_model(path, transformers.LlamaConfig(**BASE), seed=3)
    return path


def build(fp_folder, tmp_path, name, dtype=torch.float16):
    method, bits, group_size, act_order = CASES[name]
    reference = write_quantized_folder(fp_folder, tmp_path / name, method, bits, group_size, act_order, dtype)
    return tmp_path / name, reference


@pytest.mark.parametrize("name", list(CASES))
def test_dequantised_weights_are_bit_equal_to_the_formats_reference(fp_folder, tmp_path, name):
    folder, reference = build(fp_folder, tmp_path, name)
    qc = parse_quant_config(json.loads((folder / "config.json").read_text()))
    ours = dict(dequantized_weights(iter(load_file(str(folder / "model.safetensors")).items()), qc, None))
    for weight_name, ref in reference.items():
        assert torch.equal(ours[weight_name].half(), ref), weight_name


def autoawq_packing_utils():
    spec = importlib.util.find_spec("awq")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("autoawq is not installed (pip install --no-deps autoawq)")
    path = Path(spec.submodule_search_locations[0]) / "utils" / "packing_utils.py"
    module_spec = importlib.util.spec_from_file_location("awq_packing_utils", path)
    module = importlib.util.module_from_spec(module_spec)
    module_spec.loader.exec_module(module)
    return module


def test_awq_dequantised_weights_are_bit_equal_to_autoawqs_own(fp_folder, tmp_path):
    awq = autoawq_packing_utils()
    folder, _ = build(fp_folder, tmp_path, "awq4-g32")
    state = load_file(str(folder / "model.safetensors"))
    qc = parse_quant_config(json.loads((folder / "config.json").read_text()))
    ours = dict(dequantized_weights(iter(state.items()), qc, None))
    prefixes = [k.removesuffix(".qweight") for k in state if k.endswith(".qweight")]
    assert prefixes
    for prefix in prefixes:
        theirs = awq.dequantize_gemm(state[f"{prefix}.qweight"], state[f"{prefix}.qzeros"], state[f"{prefix}.scales"],
                                     4, 32)  # [K, N] fp16
        assert torch.equal(ours[f"{prefix}.weight"].half(), theirs.T), prefix


@pytest.mark.parametrize("name", list(CASES))
def test_native_layers_compute_with_the_reference_weights(fp_folder, tmp_path, name):
    folder, reference = build(fp_folder, tmp_path, name)
    model = load_model(folder, torch.device("cpu"), torch.float32).model
    layer = model.layers[1]
    x = torch.randn(3, BASE["hidden_size"], generator=torch.Generator().manual_seed(0))
    xb = x.bfloat16().float()
    for module, parts in ((layer.self_attn.qkv_proj, ("q_proj", "k_proj", "v_proj")),
                          (layer.mlp.gate_up_proj, ("gate_proj", "up_proj"))):
        prefix = "self_attn" if "q_proj" in parts else "mlp"
        weight = torch.cat([reference[f"model.layers.1.{prefix}.{p}.weight"] for p in parts]).float()
        want = xb @ weight.T
        assert isinstance(module, (Int4Linear, PermutedInput, ConcatOutputs))
        assert ((module(x) - want).abs() <= 2 * bf16_bound(xb, weight, want)).all()
    if CASES[name][3]:  # act-order: q, k, v were sorted differently, so run side by side, input gathered
        assert isinstance(layer.self_attn.qkv_proj, ConcatOutputs)
        assert all(isinstance(p, PermutedInput) for p in layer.self_attn.qkv_proj.parts)


@pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")
@pytest.mark.parametrize("name", list(CASES))
def test_gpu_layers_run_the_triton_kernel_with_the_reference_weights(fp_folder, tmp_path, name):
    """The GPU path (run here in Triton's interpreter): each checkpoint's linears on the dequant-GEMM."""
    folder, reference = build(fp_folder, tmp_path, name, torch.float32)  # the exact products
    assert checkpoint_kernels(torch.device("cuda")) == "triton" and checkpoint_kernels(torch.device("cpu")) == "cpu"
    qc = parse_quant_config(json.loads((folder / "config.json").read_text()))
    store: QuantStore = {}
    list(dequantized_weights(iter(load_file(str(folder / "model.safetensors")).items()), qc, store))
    model = load_model(fp_folder, torch.device("cpu"), torch.float32).model
    assert pack_checkpoint_linears(model, store, "triton") == 4 * BASE["num_hidden_layers"]  # qkv, o, gate_up, down
    layer = model.layers[1]
    x = torch.randn(3, BASE["hidden_size"], generator=torch.Generator().manual_seed(0))
    for module, prefix, parts in ((layer.self_attn.qkv_proj, "self_attn", ("q_proj", "k_proj", "v_proj")),
                                  (layer.mlp.gate_up_proj, "mlp", ("gate_proj", "up_proj"))):
        want = x.double() @ torch.cat([reference[f"model.layers.1.{prefix}.{p}.weight"] for p in parts]).double().T
        assert ((module(x).double() - want).abs() <= 1e-5 * want.abs().max()).all()
    kernels = [m for m in layer.modules() if isinstance(m, TritonIntLinear)]
    assert len(kernels) == (7 if CASES[name][3] else 4)  # act-order: q/k/v and gate/up sorted differently, run apart
    assert not any(isinstance(m, Int4Linear) for m in model.modules())


@pytest.mark.parametrize("name", ["gptq4-g32-act-order", "awq4-g32"])
def test_engine_on_a_quantized_folder_scores_like_transformers_on_the_reference_weights(fp_folder, tmp_path, name):
    folder, reference = build(fp_folder, tmp_path, name, torch.float32)  # the exact weights, as we load them
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(fp_folder), dtype=torch.float32).eval()
    state = hf.state_dict()
    hf.load_state_dict({k: reference[k].float() if k in reference else v for k, v in state.items()})
    ids = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    with torch.no_grad():
        want = torch.log_softmax(hf(torch.tensor([ids])).logits[0, :-1].float(), -1)
    want = want.gather(1, torch.tensor(ids[1:])[:, None])[:, 0]
    with Engine(str(folder), device="cpu", kv_cache_tokens=512) as engine:
        out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1, "temperature": 0},
                              return_logprob=True, logprob_start_len=0)
        engine.check_invariants()
    got = torch.tensor([lp.logprob for lp in out.meta.input_logprobs if lp.logprob is not None])
    assert got.shape == want.shape
    # bf16 activations in this deliberately sharp model (|logprob| ~ 40) move scores by ~1%; a wrong
    # code, zero, scale or column order moves them by tens of nats
    diff = (got - want).abs()
    assert diff.mean() <= 0.02 * want.abs().mean() and (diff <= 0.1 * want.abs() + 1.0).all(), diff.max()


def test_gptq_write_then_read_round_trips_every_field():
    g = torch.Generator().manual_seed(0)
    w = IntWeight(torch.randint(0, 16, (32, 64), generator=g, dtype=torch.int32),
                  torch.randint(1, 16, (32, 2), generator=g, dtype=torch.int32),
                  torch.rand(32, 2, generator=g).half(), torch.randperm(64, generator=g) % 2, 4)
    t = write_gptq(w, zero_offset=1)
    back = read_gptq(t["qweight"], t["qzeros"], t["scales"], t["g_idx"], 4, 32, zero_offset=1)
    assert torch.equal(back.codes, w.codes) and torch.equal(back.zeros, w.zeros)
    assert torch.equal(back.scales, w.scales) and torch.equal(back.g_idx, w.g_idx)


@pytest.mark.parametrize("qc, field", [
    ({"quant_method": "bitsandbytes"}, "quant_method"),
    ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "bits"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 100}, "group_size"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": "yes"}, "desc_act"),
    ({"quant_method": "gptq", "bits": 4, "group_size": 128, "checkpoint_format": "marlin"}, "checkpoint_format"),
    ({"quant_method": "awq", "bits": 4, "group_size": 128, "version": "gemv"}, "version"),
    ({"quant_method": "awq", "bits": 8, "group_size": 128}, "bits"),
    ({"quant_method": "w8a8_int8", "down_proj_rotation": "random"}, "down_proj_rotation"),
])
def test_bad_quantization_config_is_refused_naming_the_field(qc, field):
    with pytest.raises(ValueError, match=f"quantization_config.{field}"):
        parse_quant_config({"quantization_config": qc})
