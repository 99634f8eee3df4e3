"""The rotation before rounding (quantize/rotation.py): the rotated model computes what transformers computes
on the original weights (tied and untied heads, biases), and a rotated GPTQ / AWQ folder is a plain
checkpoint: transformers, on its tensors (the codes dequantized by the formats' reference formulas), scores
what radixlang's engine scores on the folder."""
from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file

from radixlang.runtime.engine import Engine
from radixlang.runtime.model_loading import load_model
from radixlang.runtime.models.llama import ForwardContext
from radixlang.runtime.quantize.layerwise import CausalAttention
from radixlang.runtime.quantize.rotation import random_orthogonal, rotate_model
from radixlang.server.cli import main

from ..models.hf_tiny import BASE, one_thread, save_hf_model  # noqa: F401 (one_thread: a fixture)
from ..models.quant_folders import awq_reference_dequant, gptq_reference_dequant

IDS = torch.randint(0, 256, (40,), generator=torch.Generator().manual_seed(3)).tolist()


def hf_logprobs(model: torch.nn.Module) -> torch.Tensor:
    """transformers' logprob of each next token of IDS."""
    with torch.no_grad():
        logits = model(torch.tensor([IDS])).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, torch.tensor(IDS[1:])[:, None])[:, 0]


@pytest.mark.parametrize("n", [64, 576, 40])  # Sylvester, Paley 72 x 8 (SmolLM2's hidden), no Hadamard: QR
def test_the_rotations_are_orthogonal_and_spread_an_outlier(n):
    q = random_orthogonal(n)
    assert torch.allclose(q @ q.T, torch.eye(n, dtype=torch.float64), atol=1e-12)
    spike = torch.zeros(n, dtype=torch.float64)
    spike[3] = 1.0
    assert (spike @ q).abs().max() <= 3 / n ** 0.5  # one channel's mass spread over all (Hadamard: exactly 1 / sqrt(n))


@pytest.mark.parametrize("tied, bias", [(True, False), (False, True)], ids=["tied", "untied-bias"])
def test_the_rotated_model_computes_the_originals_logits(tmp_path, one_thread, tied, bias):
    cfg = transformers.LlamaConfig(**BASE, tie_word_embeddings=tied, attention_bias=bias, mlp_bias=bias)
    hf = save_hf_model(tmp_path / "m", cfg, seed=4)
    model = load_model(tmp_path / "m", torch.device("cpu"), torch.float32).model
    embedding = model.embed_tokens.weight.clone()
    rotate_model(model)
    assert not torch.allclose(model.embed_tokens.weight, embedding, atol=0.1)  # it did rotate
    assert model.lm_head is not None and not model.config.tie_word_embeddings
    assert all(torch.equal(n.weight, torch.ones_like(n.weight)) for name, n in model.named_modules()
               if name.endswith("norm"))
    ids = torch.tensor(IDS)
    with torch.no_grad():
        logits = model.compute_logits(model(ids, torch.arange(len(ids)), ForwardContext(attn=CausalAttention())))
    got = torch.log_softmax(logits[:-1], -1).gather(1, ids[1:, None])[:, 0]
    want = hf_logprobs(hf)
    assert (got - want).abs().max() <= 1e-4 * want.abs().max()  # fp32 rounding of a sharp model (|logprob| ~ 40)


@pytest.mark.parametrize("method", ["gptq", "awq"])
def test_a_rotated_folder_loads_in_transformers_and_radixlang_alike(tmp_path, one_thread, method):
    """A tied source: the folder unties its head, and transformers, on the folder's config and its tensors
    (codes dequantized by AutoGPTQ's / AutoAWQ's formulas), scores what the engine scores on the folder."""
    source = tmp_path / "tied"
    save_hf_model(source, transformers.LlamaConfig(**BASE, tie_word_embeddings=True), seed=6)
    out = tmp_path / "q"
    assert main(["quantize", str(source), str(out), "--method", method, "--group-size", "32", "--calib-tokens",
                 "1024", "--rotate"]) == 0
    config = json.loads((out / "config.json").read_text())
    assert config["tie_word_embeddings"] is False and "rotation" in config["quantization_config"]
    state = load_file(str(out / "model.safetensors"))
    weights = {}
    for name, t in state.items():
        prefix, _, kind = name.rpartition(".")
        if kind == "qweight":
            parts = {s: state[f"{prefix}.{s}"] for s in ("qweight", "qzeros", "scales", "g_idx") if f"{prefix}.{s}" in state}
            weights[f"{prefix}.weight"] = (gptq_reference_dequant(parts, 4, torch.float32) if method == "gptq"
                                           else awq_reference_dequant(parts, 32, torch.float32))
        elif kind not in ("qzeros", "scales", "g_idx"):
            weights[name] = t.float()
    hf_config = transformers.LlamaConfig(**{k: v for k, v in config.items() if k != "quantization_config"})
    hf = transformers.AutoModelForCausalLM.from_config(hf_config, attn_implementation="eager", dtype=torch.float32)
    hf.load_state_dict(weights, strict=True)
    want = hf_logprobs(hf.eval())
    with Engine(str(out), device="cpu", kv_cache_tokens=256) as engine:
        result = engine.generate(input_ids=IDS, sampling_params={"max_new_tokens": 1}, return_logprob=True,
                                 logprob_start_len=0)
        engine.check_invariants()
    got = torch.tensor([lp.logprob for lp in result.meta.input_logprobs if lp.logprob is not None])
    # the engine runs int4 linears in bf16 on CPU (test_checkpoint_quant's bound); a wrong rotation, head or
    # norm moves scores by tens of nats. One token's bound is looser than test_checkpoint_quant's: on this
    # random model AWQ's refitted scales left one low-probability token 1.5 nats apart in bf16
    diff = (got - want).abs()
    assert diff.mean() <= 0.02 * want.abs().mean() and (diff <= 0.1 * want.abs() + 2.0).all(), diff.max()
    fp32 = hf_logprobs(transformers.AutoModelForCausalLM.from_pretrained(str(source), dtype=torch.float32).eval())
    assert (want - fp32).abs().mean() < 0.25 * fp32.abs().mean()  # and it is still the source's model
