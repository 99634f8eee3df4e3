"""MoE / MLA configs read the same from the hub's spelling and from transformers 5.24's."""
from __future__ import annotations

import pytest

from radixlang.runtime.models.deepseek_config import deepseek_config_from_hf
from radixlang.runtime.models.moe_config import moe_llama_config_from_hf

QWEN3_MOE_SAVED = {  # as transformers 5.24 writes it
    "architectures": ["Qwen3MoeForCausalLM"], "vocab_size": 288, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256,
    "num_local_experts": 6, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "norm_topk_prob": True,
    "decoder_sparse_step": 2, "mlp_only_layers": [3], "sliding_window": None, "use_sliding_window": False,
    "rope_parameters": {"rope_theta": 1e6, "rope_type": "yarn", "factor": 4.0,
                        "original_max_position_embeddings": 64},
}
QWEN3_MOE_HUB = {k: v for k, v in QWEN3_MOE_SAVED.items() if k not in ("num_local_experts", "rope_parameters")} | {
    "num_experts": 6, "rope_theta": 1e6, "sliding_window": 0,
    "rope_scaling": {"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 64}}

DEEPSEEK_V3_HUB = {  # V3's config.json on the hub, shrunk
    "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 288, "hidden_size": 64, "intermediate_size": 128,
    "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 4, "max_position_embeddings": 4096,
    "n_routed_experts": 8, "num_experts_per_tok": 2, "moe_intermediate_size": 32, "n_shared_experts": 1,
    "n_group": 4, "topk_group": 2, "topk_method": "noaux_tc", "routed_scaling_factor": 2.5,
    "first_k_dense_replace": 1, "kv_lora_rank": 32, "q_lora_rank": 24, "qk_nope_head_dim": 16,
    "qk_rope_head_dim": 8, "v_head_dim": 12, "rope_theta": 10000,
    "rope_scaling": {"type": "yarn", "factor": 40, "original_max_position_embeddings": 4096 // 40,
                     "mscale": 1.0, "mscale_all_dim": 1.0, "beta_fast": 32, "beta_slow": 1},
}
DEEPSEEK_V3_SAVED = {k: v for k, v in DEEPSEEK_V3_HUB.items()
                     if k not in ("n_routed_experts", "rope_theta", "rope_scaling", "topk_method")} | {
    "num_local_experts": 8, "head_dim": 8,  # transformers writes qk_rope_head_dim as head_dim
    "rope_parameters": {"rope_type": "yarn", "rope_theta": 10000, "factor": 40,
                        "original_max_position_embeddings": 4096 // 40, "mscale": 1.0, "mscale_all_dim": 1.0,
                        "beta_fast": 32, "beta_slow": 1}}


def test_qwen3_moe_reads_both_spellings_alike():
    saved, hub = moe_llama_config_from_hf(QWEN3_MOE_SAVED), moe_llama_config_from_hf(QWEN3_MOE_HUB)
    assert saved == hub
    cfg, spec = saved
    assert spec.num_experts == 6 and spec.norm_topk_prob and spec.sparse_layers == (1,)  # step 2, layer 3 dense
    assert cfg.rope.rope_type == "yarn" and cfg.qk_norm and cfg.sliding_window is None


def test_deepseek_v3_reads_both_spellings_and_ignores_the_saved_head_dim():
    saved, hub = deepseek_config_from_hf(DEEPSEEK_V3_SAVED), deepseek_config_from_hf(DEEPSEEK_V3_HUB)
    assert saved == hub
    assert saved.head_dim == 32 + 8  # the latent row, not the saved head_dim 8
    spec = saved.moe
    assert (spec.scoring, spec.n_group, spec.topk_group, spec.score_bias) == ("sigmoid", 4, 2, True)
    assert spec.sparse_layers == (1, 2) and spec.shared_intermediate_size == 32
    assert saved.softmax_scale > (16 + 8) ** -0.5  # YaRN's mscale_all_dim correction


def test_bad_expert_counts_name_the_field():
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        moe_llama_config_from_hf(QWEN3_MOE_SAVED | {"num_experts_per_tok": 7})
    with pytest.raises(ValueError, match="n_group"):
        deepseek_config_from_hf(DEEPSEEK_V3_HUB | {"n_group": 3})
