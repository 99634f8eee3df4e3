"""config.json -> LlamaConfig: per-architecture biases, q/k norm, sliding window and clear refusals."""
from __future__ import annotations

import pytest
import transformers  # noqa: E402

from radixlang.runtime.engine import Engine
from radixlang.runtime.models.loading.hf_config import config_from_hf

from .hf_tiny import BASE, save_hf_model


def saved(tmp_path, cls_name: str, **overrides) -> dict:
    config = getattr(transformers, cls_name)(**(BASE | overrides))
    config.architectures = [cls_name.replace("Config", "ForCausalLM")]
    config.save_pretrained(str(tmp_path))
    return config.to_dict()


@pytest.mark.parametrize("cls_name, overrides, expected", [
    ("LlamaConfig", {}, dict(qkv_bias=False, o_bias=False, mlp_bias=False, qk_norm=False)),
    ("LlamaConfig", dict(attention_bias=True, mlp_bias=True), dict(qkv_bias=True, o_bias=True, mlp_bias=True)),
    ("Qwen2Config", {}, dict(qkv_bias=True, o_bias=False, qk_norm=False)),  # Qwen2 always has q/k/v bias
    ("Qwen3Config", {}, dict(qkv_bias=False, o_bias=False, qk_norm=True)),
    ("Qwen3Config", dict(attention_bias=True), dict(qkv_bias=True, o_bias=True, qk_norm=True)),
    ("MistralConfig", dict(attention_bias=True), dict(qkv_bias=False, o_bias=False)),  # Mistral has no bias
])
def test_architecture_traits_follow_transformers_modules(tmp_path, cls_name, overrides, expected):
    from transformers import AutoModelForCausalLM

    hf = saved(tmp_path, cls_name, **overrides)
    cfg = config_from_hf(hf)
    assert {k: getattr(cfg, k) for k in expected} == expected
    # the parameters transformers builds for that config agree
    names = set(dict(AutoModelForCausalLM.from_config(getattr(transformers, cls_name)(**hf)).named_parameters()))
    assert ("model.layers.0.self_attn.q_proj.bias" in names) == cfg.qkv_bias
    assert ("model.layers.0.self_attn.o_proj.bias" in names) == cfg.o_bias
    assert ("model.layers.0.mlp.up_proj.bias" in names) == cfg.mlp_bias
    assert ("model.layers.0.self_attn.q_norm.weight" in names) == cfg.qk_norm


@pytest.mark.parametrize("cls_name, overrides, window", [
    ("MistralConfig", dict(sliding_window=48), 48),
    ("MistralConfig", dict(sliding_window=None), None),
    ("Qwen2Config", dict(sliding_window=48), None),  # use_sliding_window is off
    ("Qwen2Config", dict(sliding_window=48, use_sliding_window=True), None),  # max_window_layers 28 > 2 layers
    ("Qwen2Config", dict(sliding_window=48, use_sliding_window=True, max_window_layers=1), 48),
    ("Qwen3Config", dict(sliding_window=48, use_sliding_window=True, max_window_layers=0), 48),
    ("LlamaConfig", {}, None),
])
def test_sliding_window_caps_the_context(tmp_path, cls_name, overrides, window):
    cfg = config_from_hf(saved(tmp_path, cls_name, **overrides))
    assert cfg.sliding_window == window
    assert cfg.max_position == (window or BASE["max_position_embeddings"])


def test_engine_refuses_a_context_beyond_the_sliding_window(tmp_path):
    save_hf_model(tmp_path / "m", transformers.MistralConfig(**(BASE | dict(sliding_window=48))))
    with pytest.raises(ValueError, match="context_length 64 exceeds the model's 48"):
        Engine(str(tmp_path / "m"), device="cpu", kv_cache_tokens=256, context_length=64)
    with Engine(str(tmp_path / "m"), device="cpu", kv_cache_tokens=256) as engine:
        assert engine.context_length == 48
        with pytest.raises(ValueError, match="prompt has 48 tokens; the context holds 48"):
            engine.generate(input_ids=[5] * 48, sampling_params={"max_new_tokens": 1})
        engine.check_invariants()


@pytest.mark.parametrize("change, message", [
    ({"architectures": ["GPT2LMHeadModel"]}, "architectures \\['GPT2LMHeadModel'\\] not supported"),
    ({"hidden_act": "gelu"}, "hidden_act 'gelu' is not supported"),
    ({"sliding_window": -1}, "sliding_window must be a positive int or null"),
    ({"rope_parameters": {"rope_type": "longrope", "rope_theta": 1e4}}, "rope_type 'longrope' is not supported"),
])
def test_unsupported_configs_are_clear_errors(tmp_path, change, message):
    hf = saved(tmp_path, "MistralConfig") | change
    with pytest.raises(ValueError, match=message):
        config_from_hf(hf)
