"""Mixtral, Qwen2-MoE, Qwen3-MoE and DeepSeek-V2/V3 folders saved by transformers run in the engine with
transformers' greedy tokens, logprobs and router choices."""
from __future__ import annotations

import copy

import pytest
import torch
import transformers

from radixlang.runtime.engine import Engine
from radixlang.runtime.models import moe

from .hf_tiny import BASE, one_thread, save_hf_model
from .test_hf_parity import full_logprobs, hf_greedy, prompts

pytestmark = pytest.mark.usefixtures(one_thread.__name__)  # the fixture, imported

MOE = dict(num_experts_per_tok=2, moe_intermediate_size=32)
# MLA at tiny shapes: layer 0 dense, layer 1 MoE with a shared expert
MLA = MOE | dict(kv_lora_rank=32, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=12, n_shared_experts=1,
                 first_k_dense_replace=1, num_key_value_heads=4)  # transformers repeats K per KV head
YARN = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 32,
        "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1}
FAMILIES = {
    "mixtral": ("MixtralConfig", dict(num_local_experts=4, num_experts_per_tok=2, intermediate_size=48,
                                      sliding_window=None)),
    "qwen3-moe": ("Qwen3MoeConfig", MOE | dict(num_experts=6, norm_topk_prob=True, head_dim=16)),
    "qwen2-moe": ("Qwen2MoeConfig", MOE | dict(num_experts=4, shared_expert_intermediate_size=48,
                                               mlp_only_layers=[0])),
    "deepseek-v2": ("DeepseekV2Config", MLA | dict(n_routed_experts=6, q_lora_rank=None,
                                                   topk_method="group_limited_greedy", n_group=3, topk_group=2,
                                                   routed_scaling_factor=1.5)),
    "deepseek-v3": ("DeepseekV3Config", MLA | dict(n_routed_experts=8, q_lora_rank=24, n_group=4, topk_group=2,
                                                   rope_parameters=YARN)),
}
NEW_TOKENS = 12
TOP5_TOLERANCE = 1e-4  # the issue's goal, fp32 against transformers' fp32
# milder than hf_tiny's default gain 3: there, transformers' own fp32 top-5 logprobs sit 3.4e-4 (Mixtral) to
# 4.8e-4 (DeepSeek-V3) from its float64 ones, so no fp32 implementation could meet 1e-4 but by repeating its
# rounding; at 1.5 that floor is 7e-5 to 9e-5 and the greedy tokens still vary
PARITY_GAIN = 1.5


def build(tmp_path, name: str, gain: float = 3.0):
    cls_name, overrides = FAMILIES[name]
    config = getattr(transformers, cls_name)(**(BASE | overrides))
    model = save_hf_model(tmp_path / name, config, seed=len(name), gain=gain)
    biases = [m for n, m in model.named_buffers() if n.endswith("e_score_correction_bias")]
    if biases:  # the aux-loss-free bias is a buffer, not sharpened: give it values that change choices
        g = torch.Generator().manual_seed(1)
        for bias in biases:
            bias.copy_(0.3 * torch.randn(bias.shape, generator=g))
        model.save_pretrained(str(tmp_path / name))
    return model


@torch.no_grad()
def hf_router_choices(model, ids: list[int]) -> list[torch.Tensor]:
    """Each sparse layer's chosen experts [T, k], sorted per token, for one prompt."""
    seen: list[torch.Tensor] = []
    hooks = [layer.mlp.gate.register_forward_hook(lambda m, i, out: seen.append(out[2].sort(-1)[0]))
             for layer in model.model.layers if hasattr(layer.mlp, "gate")]
    model(torch.tensor([ids]))
    for h in hooks:
        h.remove()
    return seen


@pytest.mark.parametrize("name", list(FAMILIES))
def test_moe_engine_matches_transformers(tmp_path, monkeypatch, name):
    model = build(tmp_path, name, PARITY_GAIN)
    batch = prompts(len(name))
    expected = [hf_greedy(model, ids, NEW_TOKENS) for ids in batch]
    assert all(len(set(seq)) >= 4 for seq in expected)
    ours: list[torch.Tensor] = []
    route = moe.Router.forward

    def recording(self, x):
        weights, ids = route(self, x)
        ours.append(ids.sort(-1)[0])
        return weights, ids

    with Engine(str(tmp_path / name), device="cpu", kv_cache_tokens=1024, max_prefill_tokens=128) as engine:
        monkeypatch.setattr(moe.Router, "forward", recording)
        scored = engine.generate(input_ids=batch[0], sampling_params={"max_new_tokens": 1}, return_logprob=True,
                                 logprob_start_len=0, top_logprobs_num=5)
        monkeypatch.setattr(moe.Router, "forward", route)
        greedy = engine.generate(input_ids=batch, sampling_params={
            "max_new_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True})
        engine.check_invariants()
    assert [out.output_ids for out in greedy] == expected
    reference = hf_router_choices(model, batch[0])
    assert len(ours) == len(reference) >= 1  # the prefill's forward: one call per sparse layer
    for layer, (got, want) in enumerate(zip(ours, reference, strict=True)):
        assert torch.equal(got, want), f"layer {layer}: router choices differ"
    with torch.no_grad():
        ref = torch.log_softmax(model(torch.tensor([batch[0]])).logits[0], -1)
    got = full_logprobs(scored.meta)
    top = ref.topk(5, dim=-1)
    assert torch.equal(got.nan_to_num(float("-inf")).topk(5, dim=-1).indices.sort(-1)[0], top.indices.sort(-1)[0])
    diff = top5_error(model, batch[0], got, top)
    print(f"{name}: max |top-5 logprob diff| {diff:.2e}")
    assert diff < TOP5_TOLERANCE


def top5_error(model, ids: list[int], ours: torch.Tensor, top) -> float:
    """Our logprobs' largest distance from transformers' at its top 5 tokens: from its fp32, or, where that reference's
    own rounding is off (its fp32 sits up to ~1e-4 from its float64 here, more on a CPU whose reductions round
    otherwise: an AVX2-only one read 1.04e-4 for DeepSeek-V2), from its float64, the exact answer: the lower."""
    fp32 = float((ours.gather(1, top.indices) - top.values).abs().max())
    if fp32 < TOP5_TOLERANCE:
        return fp32
    with torch.no_grad():
        double = copy.deepcopy(model).double()
        double.config._experts_implementation = "eager"  # the grouped GEMM reads no float64
        exact = torch.log_softmax(double(torch.tensor([ids])).logits[0], -1)
    return min(fp32, float((ours.gather(1, top.indices).double() - exact.gather(1, top.indices)).abs().max()))
