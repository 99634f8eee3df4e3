"""RoPE: both config formats read alike, tables equal transformers' rotary embedding, bad types refused."""
from __future__ import annotations

import json

import pytest
import torch
import transformers  # noqa: E402

from radixlang.runtime.models.loading.hf_config import config_from_hf
from radixlang.runtime.models.rope import RopeScaling, rope_cos_sin, rope_from_hf, rope_inv_freq

HEAD_DIM, MAX_POSITION = 32, 512
SCALINGS = {
    "default": None,
    "linear": {"rope_type": "linear", "factor": 4.0},
    "dynamic": {"rope_type": "dynamic", "factor": 2.0},
    "yarn": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 32},
    "yarn-mscale": {"rope_type": "yarn", "factor": 16.0, "original_max_position_embeddings": 32,
                    "mscale": 0.707, "mscale_all_dim": 1.0, "beta_fast": 16, "beta_slow": 2, "truncate": False},
    "llama3": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 64},
}


def hf_config(scaling: dict | None, theta: float = 500000.0):
    return transformers.LlamaConfig(hidden_size=HEAD_DIM * 4, num_attention_heads=4, rope_theta=theta,
                                    rope_scaling=scaling, max_position_embeddings=MAX_POSITION,
                                    architectures=["LlamaForCausalLM"])


def saved_config_json(tmp_path, config) -> dict:
    config.save_pretrained(str(tmp_path))
    return json.loads((tmp_path / "config.json").read_text())


def old_format(new: dict) -> dict:
    """The config.json transformers 4.x wrote: rope_theta at the top, rope_scaling with `type`, or null."""
    old = {k: v for k, v in new.items() if k != "rope_parameters"}
    params = dict(new["rope_parameters"])
    old["rope_theta"] = params.pop("rope_theta")
    kind = params.pop("rope_type")
    old["rope_scaling"] = None if kind == "default" else {"type": kind, **params}
    return old


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_cos_sin_tables_equal_transformers_rotary_embedding(kind):
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    config = hf_config(SCALINGS[kind])
    positions = torch.arange(MAX_POSITION)
    hf_cos, hf_sin = LlamaRotaryEmbedding(config)(torch.zeros(1), positions[None])
    cos, sin = rope_cos_sin(rope_from_hf(config.to_dict()), HEAD_DIM, MAX_POSITION)
    # transformers concatenates the half-dimension table with itself (rotate-half layout)
    assert torch.allclose(torch.cat([cos, cos], -1), hf_cos[0], atol=1e-6, rtol=0)
    assert torch.allclose(torch.cat([sin, sin], -1), hf_sin[0], atol=1e-6, rtol=0)
    if kind != "default":
        plain, _ = rope_cos_sin(RopeScaling(theta=500000.0), HEAD_DIM, MAX_POSITION)
        assert kind == "dynamic" or not torch.allclose(cos, plain)  # the scaling really changes the table


@pytest.mark.parametrize("kind", list(SCALINGS))
def test_old_and_new_config_formats_load_the_same_rope(tmp_path, kind):
    new = saved_config_json(tmp_path, hf_config(SCALINGS[kind]))
    assert "rope_parameters" in new and "rope_theta" not in new  # what transformers 5 writes
    rope = rope_from_hf(new)
    assert rope.theta == 500000.0
    assert rope.rope_type == ("default" if kind == "default" else SCALINGS[kind]["rope_type"])
    assert rope_from_hf(old_format(new)) == rope
    assert config_from_hf(old_format(new)) == config_from_hf(new)


def test_theta_inside_rope_parameters_is_not_lost():
    """The transformers 5 layout that used to load with theta 10000."""
    hf = {"rope_parameters": {"rope_theta": 100000.0, "rope_type": "default"}, "max_position_embeddings": 64}
    assert rope_from_hf(hf).theta == 100000.0
    assert rope_from_hf({"rope_theta": 100000.0}).theta == 100000.0
    assert rope_from_hf({}).theta == 10000.0


@pytest.mark.parametrize("scaling", [{"rope_type": "longrope", "factor": 2.0, "long_factor": [1.0],
                                      "short_factor": [1.0]}, {"type": "su", "factor": 2.0},
                                     {"rope_type": "proportional"}, {"type": "mrope"}])
def test_unknown_rope_type_is_a_clear_error(scaling):
    with pytest.raises(ValueError, match="rope_type .* is not supported; supported types: default, linear"):
        rope_from_hf({"rope_scaling": scaling, "max_position_embeddings": 64})


def test_incomplete_or_partial_rope_is_refused():
    with pytest.raises(ValueError, match="'llama3' needs \\['low_freq_factor', 'high_freq_factor'\\]"):
        rope_from_hf({"rope_parameters": {"rope_type": "llama3", "factor": 8.0}})
    with pytest.raises(ValueError, match="factor must be a number > 0"):
        rope_from_hf({"rope_scaling": {"type": "linear", "factor": 0}})
    with pytest.raises(ValueError, match="partial_rotary_factor must be 1.0"):
        rope_from_hf({"rope_theta": 1e4, "partial_rotary_factor": 0.5})


def test_per_layer_type_rope_parameters_must_agree():
    same = {"rope_type": "default", "rope_theta": 1e6}
    hf = {"layer_types": ["full_attention", "sliding_attention"],
          "rope_parameters": {"full_attention": same, "sliding_attention": dict(same)}}
    assert rope_from_hf(hf).theta == 1e6
    hf["rope_parameters"]["sliding_attention"] = {"rope_type": "default", "rope_theta": 1e4}
    with pytest.raises(ValueError, match="differ between layer types"):
        rope_from_hf(hf)


def test_gguf_rope_freqs_divide_the_frequencies():
    divisors = tuple(float(i + 1) for i in range(HEAD_DIM // 2))
    base = rope_inv_freq(RopeScaling(theta=1e4), HEAD_DIM)
    scaled = rope_inv_freq(RopeScaling(theta=1e4, freq_divisors=divisors), HEAD_DIM)
    assert torch.equal(scaled, base / torch.tensor(divisors))


def test_scaling_without_a_pretraining_context_is_refused():
    with pytest.raises(ValueError, match="'yarn' needs original_max_position_embeddings > 0"):
        rope_from_hf({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})
