"""config.json of DeepSeek-V2 / V3 -> DeepseekConfig.

Read in both spellings: hub folders say `n_routed_experts` and `rope_scaling`, transformers 5 may write
`num_local_experts` and `rope_parameters`. The `head_dim` transformers 5 saves for V3 is qk_rope_head_dim
(the RoPE table's width), not the attention head size, so it is not read: the head sizes come from
qk_nope_head_dim / qk_rope_head_dim / v_head_dim.
"""
from __future__ import annotations

import math
from typing import Any

from .deepseek import DeepseekConfig
from .moe import MoeSpec
from .moe_config import first_of, num_routed_experts
from .rope import rope_from_hf

DEEPSEEK_V2, DEEPSEEK_V3 = "DeepseekV2ForCausalLM", "DeepseekV3ForCausalLM"
DEEPSEEK_ARCHS = (DEEPSEEK_V2, DEEPSEEK_V3)
_TOPK_METHODS = ("greedy", "group_limited_greedy", "noaux_tc")


def deepseek_config_from_hf(hf: dict[str, Any]) -> DeepseekConfig:
    v3 = DEEPSEEK_V3 in (hf.get("architectures") or [])
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported; DeepSeek models use 'silu'")
    nope, rope_dim, v_dim = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"], hf["v_head_dim"]
    if rope_dim % 2:
        raise ValueError(f"qk_rope_head_dim must be even, got {rope_dim}")
    rope = rope_from_hf(hf)
    return DeepseekConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=hf["num_attention_heads"],
        q_lora_rank=hf.get("q_lora_rank"),
        kv_lora_rank=hf["kv_lora_rank"],
        qk_nope_head_dim=nope,
        qk_rope_head_dim=rope_dim,
        v_head_dim=v_dim,
        max_position=hf.get("max_position_embeddings") or (163840 if v3 else 2048),
        softmax_scale=_softmax_scale(hf, nope + rope_dim),
        moe=_moe_spec(hf, v3),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope=rope,
        rope_interleave=bool(hf.get("rope_interleave", True)) if v3 else True,  # V2 rotates pairs always
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        attention_bias=bool(hf.get("attention_bias", False)),
    )


def _softmax_scale(hf: dict[str, Any], qk_head_dim: int) -> float:
    """YaRN models scale the attention logits by mscale(factor, mscale_all_dim) squared, as DeepSeek does."""
    params = hf.get("rope_parameters") or hf.get("rope_scaling") or {}
    scale = qk_head_dim**-0.5
    kind = params.get("rope_type", params.get("type", "default"))
    all_dim = params.get("mscale_all_dim") or 0
    if kind != "default" and all_dim and params.get("factor", 1.0) > 1:
        mscale = 0.1 * all_dim * math.log(params["factor"]) + 1.0
        scale *= mscale * mscale
    return scale


def _moe_spec(hf: dict[str, Any], v3: bool) -> MoeSpec:
    n = num_routed_experts(hf)
    method = hf.get("topk_method") or ("noaux_tc" if v3 else "greedy")
    if method not in _TOPK_METHODS:
        raise ValueError(f"topk_method {method!r} is not supported ({', '.join(_TOPK_METHODS)} are)")
    grouped = v3 or method == "group_limited_greedy"
    n_group = (hf.get("n_group") or 1) if grouped else 1
    topk_group = (hf.get("topk_group") or 1) if grouped else 1
    if n % n_group or not 1 <= topk_group <= n_group:
        raise ValueError(f"n_group {n_group} must divide the {n} experts and topk_group {topk_group} be in "
                         f"[1, n_group]")
    first_dense = hf.get("first_k_dense_replace") or 0
    inter = hf["moe_intermediate_size"]
    return MoeSpec(
        num_experts=n,
        top_k=hf["num_experts_per_tok"],
        intermediate_size=inter,
        scoring="sigmoid" if v3 else "softmax",
        norm_topk_prob=bool(hf.get("norm_topk_prob", True)) if v3 else False,  # transformers' V2 never renormalises
        n_group=n_group,
        topk_group=topk_group,
        routed_scaling_factor=float(first_of(hf, "routed_scaling_factor", default=1.0)),
        score_bias=v3,
        shared_intermediate_size=inter * (hf.get("n_shared_experts") or 0),
        sparse_layers=tuple(range(first_dense, hf["num_hidden_layers"])),
    )
