"""DeepSeek-V2 / V3 GGUF files (llama.cpp's `deepseek2` architecture) as the config.json and HF-named weights
their folder would hold, so they load through the same DeepseekForCausalLM.

llama.cpp writes MLA as MQA over the latent: `attention.key_length` is kv_lora_rank + qk_rope_head_dim and
`attention.value_length` kv_lora_rank, the per-head sizes going to `key_length_mla` / `value_length_mla`
(files written before those keys hold the per-head sizes in key_length / value_length). kv_b_proj is
stored whole (`attn_kv_b`, older files) or split per head into `attn_k_b` (W_UK, transposed: [heads, rank,
nope]) and `attn_v_b` (W_UV: [heads, v, rank]). The sigmoid gating function marks V3, whose aux-loss-free
bias is `exp_probs_b.bias`. RoPE dims stay in the checkpoint's interleaved-pair order (llama.cpp rotates
pairs for this architecture), as in an HF folder.
"""
from __future__ import annotations

from typing import Any, Iterable, Iterator

import torch

from ..deepseek_config import DEEPSEEK_V2, DEEPSEEK_V3

DEEPSEEK_GGUF_ARCH = "deepseek2"
_SIGMOID_GATING = 2  # gguf.ExpertGatingFuncType.SIGMOID (1: softmax)

_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",  # without a q LoRA (V2-Lite)
    "attn_q_a": "self_attn.q_a_proj",
    "attn_q_a_norm": "self_attn.q_a_layernorm",
    "attn_q_b": "self_attn.q_b_proj",
    "attn_kv_a_mqa": "self_attn.kv_a_proj_with_mqa",
    "attn_kv_a_norm": "self_attn.kv_a_layernorm",
    "attn_kv_b": "self_attn.kv_b_proj",
    "attn_output": "self_attn.o_proj",
    "ffn_gate": "mlp.gate_proj",  # the leading dense layers
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
    "ffn_gate_inp": "mlp.gate",
    "ffn_gate_shexp": "mlp.shared_experts.gate_proj",
    "ffn_up_shexp": "mlp.shared_experts.up_proj",
    "ffn_down_shexp": "mlp.shared_experts.down_proj",
}
_TOP_NAMES = {"token_embd": "embed_tokens", "output_norm": "norm", "output": "lm_head"}
_EXPERTS = {"ffn_gate_exps": "gate_proj", "ffn_up_exps": "up_proj", "ffn_down_exps": "down_proj"}


def deepseek_gguf_to_hf_config(meta: dict[str, Any], tensor_names: set[str],
                               rope_scaling: dict[str, Any]) -> dict[str, Any]:
    """The config.json a DeepSeek folder would hold; `rope_scaling`: the file's, read as every
    architecture's is (loader.gguf_rope_scaling)."""
    def get(key: str, default: Any = None) -> Any:  # noqa: ANN401 - a metadata value: int, float, str or list
        return meta.get(f"{DEEPSEEK_GGUF_ARCH}.{key}", default)

    rope_dim = get("rope.dimension_count")
    key_length, value_length = get("attention.key_length_mla"), get("attention.value_length_mla")
    if key_length is None:  # written before the MLA keys: the per-head sizes sit in the plain ones
        key_length, value_length = get("attention.key_length"), get("attention.value_length")
    v3 = get("expert_gating_func") == _SIGMOID_GATING
    groups = get("expert_group_count") or 1
    rope = {"rope_theta": get("rope.freq_base", 10000.0), **rope_scaling}
    log_mul = get("rope.scaling.yarn_log_multiplier")
    if rope["rope_type"] == "yarn" and log_mul:  # llama.cpp keeps 0.1 * mscale_all_dim (= mscale in DeepSeek's)
        rope["mscale"] = rope["mscale_all_dim"] = log_mul / 0.1
    return {
        "architectures": [DEEPSEEK_V3 if v3 else DEEPSEEK_V2],
        "vocab_size": get("vocab_size") or len(meta["tokenizer.ggml.tokens"]),
        "hidden_size": get("embedding_length"),
        "intermediate_size": get("feed_forward_length"),
        "moe_intermediate_size": get("expert_feed_forward_length"),
        "num_hidden_layers": get("block_count"),
        "num_attention_heads": get("attention.head_count"),
        "q_lora_rank": get("attention.q_lora_rank"),
        "kv_lora_rank": get("attention.kv_lora_rank"),
        "qk_rope_head_dim": rope_dim,
        "qk_nope_head_dim": key_length - rope_dim,
        "v_head_dim": value_length,
        "n_routed_experts": get("expert_count"),
        "num_experts_per_tok": get("expert_used_count"),
        "n_shared_experts": get("expert_shared_count", 0),
        "first_k_dense_replace": get("leading_dense_block_count", 0),
        "routed_scaling_factor": get("expert_weights_scale", 1.0),
        "norm_topk_prob": get("expert_weights_norm", False),
        "topk_method": "noaux_tc" if v3 else ("group_limited_greedy" if groups > 1 else "greedy"),
        "n_group": groups,
        "topk_group": get("expert_group_used_count") or 1,
        "max_position_embeddings": get("context_length"),
        "rms_norm_eps": get("attention.layer_norm_rms_epsilon", 1e-6),
        "rope_parameters": rope,
        "tie_word_embeddings": "output.weight" not in tensor_names,
    }


def deepseek_gguf_weights(tensors: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """A `deepseek2` file's (GGUF name, fp32 tensor in torch's dimension order) -> HF-named weights: experts
    per expert, kv_b_proj whole."""
    k_b: dict[str, torch.Tensor] = {}
    v_b: dict[str, torch.Tensor] = {}
    for gguf_name, tensor in tensors:
        parts = gguf_name.split(".")
        if parts[0] != "blk":
            yield f"{_TOP_NAMES[parts[0]]}.{parts[1]}", tensor
            continue
        layer, stem, prefix = parts[1], parts[2], f"layers.{parts[1]}"
        if stem in _EXPERTS:
            for expert, w in enumerate(tensor):
                yield f"{prefix}.mlp.experts.{expert}.{_EXPERTS[stem]}.weight", w
        elif stem == "exp_probs_b":
            yield f"{prefix}.mlp.gate.e_score_correction_bias", tensor
        elif stem in ("attn_k_b", "attn_v_b"):
            (k_b if stem == "attn_k_b" else v_b)[layer] = tensor
            if layer in k_b and layer in v_b:
                yield f"{prefix}.self_attn.kv_b_proj.weight", _kv_b(k_b.pop(layer), v_b.pop(layer))
        else:
            yield f"{prefix}.{_LAYER_NAMES[stem]}.{parts[3]}", tensor
    if k_b or v_b:
        raise ValueError(f"GGUF layers {sorted(set(k_b) | set(v_b))} hold only one of attn_k_b / attn_v_b")


def _kv_b(k_b: torch.Tensor, v_b: torch.Tensor) -> torch.Tensor:
    """kv_b_proj [heads * (nope + v), rank] from W_UK^T [heads, rank, nope] and W_UV [heads, v, rank]."""
    w = torch.cat([k_b.transpose(1, 2), v_b], dim=1)
    return w.reshape(-1, w.shape[-1])
