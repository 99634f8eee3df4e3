"""GGUF files written with gguf's own writer and quantizers load to the weights gguf dequantizes to,
and GGUF metadata maps to the same model config as the HF config.json it was converted from."""
from __future__ import annotations

import dataclasses
import json

import numpy as np
import pytest
import torch
import transformers
from safetensors.torch import save_file

from radixlang.runtime.engine import Engine
from radixlang.runtime.model_loading import load_model
from radixlang.runtime.models.loading.hf_config import config_from_hf
from radixlang.runtime.models.rope import rope_cos_sin

from .gguf_tiny import K_QUANTS, Q, gguf_tensors, write_gguf
from .hf_tiny import BASE, save_hf_model, write_tokenizer

QUANTIZABLE = [Q.Q4_0, Q.Q4_1, Q.Q5_0, Q.Q5_1, Q.Q8_0, Q.BF16]  # gguf has quantizers for these


def hf_folder(path, hf: dict, weights: dict[str, torch.Tensor]):
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(hf))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"))
    write_tokenizer(path, "<s>", "</s>")
    return path


def state(path) -> dict[str, torch.Tensor]:
    loaded = load_model(path, torch.device("cpu"), torch.float32)
    return dict(loaded.model.state_dict())  # the rotary table is a non-persistent buffer: not in it


@pytest.mark.parametrize("qtype", QUANTIZABLE + K_QUANTS + [Q.F16], ids=lambda q: q.name)
def test_quantized_tensors_load_as_gguf_dequantizes_them(tmp_path, qtype):
    # rows of 256 values: the K-quants' super-block
    config = transformers.LlamaConfig(**(BASE | dict(hidden_size=256, intermediate_size=512, num_hidden_layers=1,
                                                     num_attention_heads=4, num_key_value_heads=2)))
    model = save_hf_model(tmp_path / "hf", config)
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    tensors, expected = gguf_tensors(hf, dict(model.state_dict()), qtype, np.random.default_rng(0))
    write_gguf(tmp_path / "m.gguf", hf, tensors)
    got, want = state(tmp_path / "m.gguf"), state(hf_folder(tmp_path / "deq", hf, expected))
    assert got.keys() == want.keys()
    for name in want:
        assert torch.equal(got[name], want[name]), name


FAMILIES = {
    "qwen2": ("Qwen2Config", dict(rope_theta=1000000.0, tie_word_embeddings=True)),
    "qwen2.5-yarn": ("Qwen2Config", dict(rope_theta=1000000.0, rope_scaling={
        "rope_type": "yarn", "factor": 8.0, "original_max_position_embeddings": 32})),
    "qwen3": ("Qwen3Config", dict(rope_theta=1000000.0, head_dim=32)),
    "mistral": ("MistralConfig", dict(rope_theta=1000000.0, sliding_window=None)),
    "mistral-window": ("MistralConfig", dict(sliding_window=128)),
    "llama-linear": ("LlamaConfig", dict(rope_scaling={"rope_type": "linear", "factor": 4.0})),
}


@pytest.mark.parametrize("name", list(FAMILIES))
def test_gguf_metadata_maps_like_the_hf_config(tmp_path, name):
    cls_name, overrides = FAMILIES[name]
    model = save_hf_model(tmp_path / "hf", getattr(transformers, cls_name)(**(BASE | overrides)))
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    tensors, _ = gguf_tensors(hf, dict(model.state_dict()), Q.F32, None)
    write_gguf(tmp_path / "m.gguf", hf, tensors)
    from radixlang.runtime.models.loading.loader import _read_gguf

    gguf_cfg, hf_cfg = _read_gguf(tmp_path / "m.gguf")[0], config_from_hf(hf)
    # GGUF stores eps as fp32, the precision RMSNorm adds it in anyway
    assert gguf_cfg.rms_norm_eps == float(np.float32(hf_cfg.rms_norm_eps))
    assert dataclasses.replace(gguf_cfg, rms_norm_eps=hf_cfg.rms_norm_eps) == hf_cfg
    assert state(tmp_path / "m.gguf").keys() == state(tmp_path / "hf").keys()
    prompt = {"input_ids": list(range(3, 60)), "sampling_params": {"max_new_tokens": 8, "temperature": 0,
                                                                     "ignore_eos": True}}
    outs = []
    for path in (tmp_path / "m.gguf", tmp_path / "hf"):
        with Engine(str(path), device="cpu", kv_cache_tokens=256) as engine:
            outs.append(engine.generate(**prompt).output_ids)
            engine.check_invariants()
    assert outs[0] == outs[1]


def llama_cpp_rope_freqs(rope: dict, head_dim: int) -> np.ndarray:
    """The `rope_freqs` tensor llama.cpp's converter writes for Llama 3.1 rope scaling: per-dimension divisors."""
    inv_freq = 1.0 / (rope["rope_theta"] ** (np.arange(0, head_dim, 2, dtype=np.float64) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    context = rope["original_max_position_embeddings"]
    divisors = []
    for freq in inv_freq:
        wavelen = 2 * np.pi / freq
        if wavelen < context / high:
            divisors.append(1.0)
        elif wavelen > context / low:
            divisors.append(factor)
        else:
            smooth = (context / wavelen - low) / (high - low)
            divisors.append(1 / ((1 - smooth) / factor + smooth))
    return np.array(divisors, dtype=np.float32)


def test_llama31_gguf_rope_freqs_give_transformers_llama3_tables(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 32}
    config = transformers.LlamaConfig(**(BASE | dict(rope_theta=500000.0, rope_scaling=scaling)))
    model = save_hf_model(tmp_path / "hf", config)
    hf = json.loads((tmp_path / "hf" / "config.json").read_text())
    tensors, _ = gguf_tensors(hf, dict(model.state_dict()), Q.F32, None)
    head_dim = hf["head_dim"]
    tensors["rope_freqs.weight"] = (llama_cpp_rope_freqs(hf["rope_parameters"], head_dim), None)
    write_gguf(tmp_path / "m.gguf", hf | {"rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}},
               tensors)
    from radixlang.runtime.models.loading.loader import _read_gguf

    gguf_rope = _read_gguf(tmp_path / "m.gguf")[0].rope
    assert gguf_rope.freq_divisors is not None and max(gguf_rope.freq_divisors) == 8.0
    gguf_cos, _ = rope_cos_sin(gguf_rope, head_dim, 256)
    hf_cos, _ = rope_cos_sin(config_from_hf(hf).rope, head_dim, 256)
    assert torch.allclose(gguf_cos, hf_cos, atol=1e-5, rtol=0)
    loaded = load_model(tmp_path / "m.gguf", torch.device("cpu"), torch.float32).model
    assert torch.equal(loaded.rotary.cos_sin.chunk(2, dim=-1)[0], gguf_cos)  # rope_freqs reached the model
