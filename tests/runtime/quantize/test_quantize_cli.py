"""`radixlang quantize` end to end on a tiny model: the folders it writes load natively and score close to
the fp32 model; GPTQ's folder holds exactly the codes the format reference reads back; bad options fail
naming the option."""
from __future__ import annotations

import json

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
    dequantized_weights,
    parse_quant_config,
)
from radixlang.runtime.models.linear.hadamard import HadamardInput
from radixlang.runtime.models.linear.quant import Int4Linear
from radixlang.runtime.models.linear.triton_quant import TritonW8A8Linear
from radixlang.runtime.models.linear.w8a8 import W8A8Linear
from radixlang.runtime.models.loading import loader, weight_cache
from radixlang.runtime.quantize.driver import QuantizeOptions, quantize
from radixlang.server.cli import main

from ..models.hf_tiny import BASE, save_hf_model
from ..models.quant_folders import awq_reference_dequant, gptq_reference_dequant

IDS = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(7)).tolist()


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    path = tmp_path_factory.mktemp("cli") / "llama"
    save_hf_model(path, transformers.LlamaConfig(**BASE), seed=5)
    return path


def prompt_logprobs(path) -> torch.Tensor:
    with Engine(str(path), device="cpu", kv_cache_tokens=256) as engine:
        out = engine.generate(input_ids=IDS, sampling_params={"max_new_tokens": 1}, return_logprob=True,
                              logprob_start_len=0)
        engine.check_invariants()
    return torch.tensor([lp.logprob for lp in out.meta.input_logprobs if lp.logprob is not None])


@pytest.mark.parametrize("args, kind", [
    (["--method", "gptq", "--group-size", "32", "--desc-act"], (Int4Linear, PermutedInput, ConcatOutputs)),
    (["--method", "gptq", "--bits", "8", "--group-size", "-1", "--asymmetric", "0"], (Int4Linear,)),  # plain GPTQ
    (["--method", "awq", "--group-size", "32", "--calibration", "prose"], (Int4Linear,)),
    (["--method", "smoothquant"], (W8A8Linear,)),
    (["--method", "smoothquant", "--fp-down", "1"], (W8A8Linear,)),
    (["--method", "smoothquant", "--no-rotate-down"], (W8A8Linear,)),
])
def test_quantized_folder_loads_natively_and_scores_close_to_fp32(folder, tmp_path, args, kind):
    out = tmp_path / "q"
    assert main(["quantize", str(folder), str(out), *args, "--calib-tokens", "1024"]) == 0
    model = load_model(out, torch.device("cpu"), torch.float32).model
    kept = int(args[args.index("--fp-down") + 1]) if "--fp-down" in args else 0  # down_projs left in fp32
    downs = [layer.mlp.down_proj for layer in model.layers]
    rotated = "smoothquant" in args and "--no-rotate-down" not in args  # --rotate-down is SmoothQuant's default
    assert all(isinstance(d, HadamardInput) == rotated for d in downs)
    downs = [d.inner for d in downs] if rotated else downs
    assert sum(isinstance(d, kind) for d in downs) == len(model.layers) - kept
    assert all(d.weight.dtype == torch.float32 for d in downs if not isinstance(d, kind))
    fp32, quantized = prompt_logprobs(folder), prompt_logprobs(out)
    err = (quantized - fp32).abs().mean() / fp32.abs().mean()
    print(f"{args}: mean relative |logprob error| {err:.4f}")
    assert err < (0.1 if "4" not in args and "--bits" in args or "smoothquant" in args else 0.25)
    if args[1] == "gptq":  # the folder's weights, as the format's reference reads them, are what we run
        state = load_file(str(out / "model.safetensors"))
        qc = parse_quant_config(json.loads((out / "config.json").read_text()))
        ours = dict(dequantized_weights(iter(state.items()), qc, None))
        prefixes = [k.removesuffix(".qweight") for k in state if k.endswith(".qweight")]
        assert len(prefixes) == 7 * BASE["num_hidden_layers"]
        for prefix in prefixes:
            t = {s: state[f"{prefix}.{s}"] for s in ("qweight", "qzeros", "scales", "g_idx")}
            assert torch.equal(ours[f"{prefix}.weight"], gptq_reference_dequant(t, qc.bits, torch.float32))
    if args[1] == "awq":  # AWQ's format (GEMM packing), as AutoAWQ's formula reads it
        state = load_file(str(out / "model.safetensors"))
        assert json.loads((out / "config.json").read_text())["quantization_config"]["quant_method"] == "awq"
        assert {k.rpartition(".")[2] for k in state if ".mlp." in k} == {"qweight", "qzeros", "scales"}
        qc = parse_quant_config(json.loads((out / "config.json").read_text()))
        ours = dict(dequantized_weights(iter(state.items()), qc, None))
        for prefix in [k.removesuffix(".qweight") for k in state if k.endswith(".qweight")]:
            t = {s: state[f"{prefix}.{s}"] for s in ("qweight", "qzeros", "scales")}
            assert torch.equal(ours[f"{prefix}.weight"], awq_reference_dequant(t, 32, torch.float32))


def test_a_w8a8_folders_tied_head_runs_w8a8_over_an_int8_copy_of_the_embedding(tmp_path):
    tied = tmp_path / "tied"
    save_hf_model(tied, transformers.LlamaConfig(**BASE, tie_word_embeddings=True), seed=6)
    out = quantize(tied, tmp_path / "q", QuantizeOptions(method="smoothquant", smooth=False))
    model = load_model(out, torch.device("cpu"), torch.float32).model
    embedding = model.embed_tokens.weight
    assert isinstance(model.lm_head, W8A8Linear) and embedding.dtype == torch.float32  # lookups stay exact
    step = embedding.abs().amax(dim=1, keepdim=True) / 127  # per-row int8: within half a step of each weight
    assert ((model.lm_head.dequantized() - embedding).abs() <= step / 2 * (1 + 1e-5)).all()
    hidden = torch.randn(5, BASE["hidden_size"], generator=torch.Generator().manual_seed(0))
    assert torch.equal(model.compute_logits(hidden), model.lm_head(hidden))
    fp32, quantized = prompt_logprobs(tied), prompt_logprobs(out)
    assert (quantized - fp32).abs().mean() < 0.1 * fp32.abs().mean()


@pytest.mark.slow  # a whole engine's linears in Triton's interpreter
@pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")
@pytest.mark.parametrize("smooth", [True, False], ids=["smoothquant", "rtn-w8a8"])
def test_w8a8_folders_run_the_triton_int8_gemm_on_gpu_and_score_as_on_cpu(folder, tmp_path, monkeypatch, smooth):
    """The GPU path, run here in Triton's interpreter: every linear of a W8A8 folder on the Triton int8 GEMM,
    and the engine's scores those of the CPU's torch._int_mm linears within float rounding."""
    out = quantize(folder, tmp_path / "q", QuantizeOptions(method="smoothquant", smooth=smooth))
    cpu = prompt_logprobs(out)
    monkeypatch.setattr(loader, "checkpoint_kernels", lambda device: "triton")  # what it picks on a CUDA device
    model = load_model(out, torch.device("cpu"), torch.float32).model
    linears = [m for m in model.modules() if isinstance(m, W8A8Linear)]
    assert len(linears) == 4 * BASE["num_hidden_layers"] and all(type(m) is TritonW8A8Linear for m in linears)
    gpu = prompt_logprobs(out)
    assert (gpu - cpu).abs().max() <= 1e-4 * cpu.abs().max()


def test_quantizing_leaves_the_source_folders_cached_weights_as_they_are(tmp_path):
    """The loader writes a folder's fused weights to the cache on a background thread, from the model's own
    tensors, and quantize then smooths and rounds those in place: the entry held the smoothed gate/up, and a
    later load of the source in the same process (the same cache folder) ran a broken model (what made the
    SmoothQuant cases' scores depend on the tests run before them). Oracle: the checkpoint's own tensors."""
    source = tmp_path / "source"
    save_hf_model(source, transformers.LlamaConfig(**BASE), seed=8)
    quantize(source, tmp_path / "q", QuantizeOptions(method="smoothquant", alpha=0.5, calib_tokens=1024))
    weight_cache.wait_for_write()
    state = load_file(str(source / "model.safetensors"))
    model = load_model(source, torch.device("cpu"), torch.float32).model  # the fused weights from the cache entry
    for i, layer in enumerate(model.layers):
        want = torch.cat([state[f"model.layers.{i}.mlp.{p}.weight"] for p in ("gate_proj", "up_proj")])
        assert torch.equal(layer.mlp.gate_up_proj.weight, want)


@pytest.mark.parametrize("args, field", [
    (["--method", "gptq", "--group-size", "100"], "--group-size"),
    (["--method", "gptq", "--calibration", "/no/such/file.txt"], "--calibration"),
    (["--method", "awq", "--bits", "8"], "--bits"),
    (["--method", "smoothquant", "--alpha", "1.5"], "--alpha"),
    (["--method", "rtn", "--rotate"], "--rotate"),
    (["--method", "gptq", "--asymmetric", "1.5"], "--asymmetric"),
])
def test_bad_quantize_options_fail_naming_the_option(folder, tmp_path, capsys, args, field):
    assert main(["quantize", str(folder), str(tmp_path / "q"), *args]) == 2
    assert field in capsys.readouterr().err


def test_a_gguf_sources_config_is_the_one_its_model_card_publishes():
    """`radixlang quantize` on the default GGUF writes SmolLM2-135M's config.json (values from its HF card)."""
    from radixlang.runtime.models.loading.loader import default_model_path
    from radixlang.runtime.quantize.hf_writer import source_hf_config

    cfg = source_hf_config(default_model_path())
    assert {k: cfg[k] for k in ("model_type", "hidden_size", "intermediate_size", "num_hidden_layers",
                                "num_attention_heads", "num_key_value_heads", "vocab_size")} == {
        "model_type": "llama", "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30,
        "num_attention_heads": 9, "num_key_value_heads": 3, "vocab_size": 49152}
