"""config.json of a Llama-attention MoE model (Mixtral, Qwen2-MoE, Qwen3-MoE) -> (LlamaConfig, MoeSpec).

The attention and norms are the dense sibling's, read by `config_from_hf`; this module reads the experts.
Both spellings of each field are read: hub folders say `num_experts`, transformers 5.24 writes
`num_local_experts` for some families.
"""
from __future__ import annotations

from typing import Any

from .llama import LlamaConfig
from .loading.hf_config import MISTRAL, QWEN2, QWEN3, config_from_hf
from .moe import MoeSpec

MIXTRAL, QWEN2_MOE, QWEN3_MOE = "MixtralForCausalLM", "Qwen2MoeForCausalLM", "Qwen3MoeForCausalLM"
_DENSE_SIBLING = {MIXTRAL: MISTRAL, QWEN2_MOE: QWEN2, QWEN3_MOE: QWEN3}
MOE_LLAMA_ARCHS = tuple(_DENSE_SIBLING)


def first_of(hf: dict[str, Any], *names: str,
             default: object = None) -> Any:  # noqa: ANN401 - a config.json value; each caller knows its key's type
    """The first of `names` that the config sets (not null)."""
    for name in names:
        if hf.get(name) is not None:
            return hf[name]
    return default


def num_routed_experts(hf: dict[str, Any]) -> int:
    n = first_of(hf, "num_local_experts", "num_experts", "n_routed_experts")
    if not isinstance(n, int) or n < 1:
        raise ValueError(f"num_experts (or num_local_experts / n_routed_experts) must be a positive int, got {n!r}")
    top_k = hf.get("num_experts_per_tok")
    if not isinstance(top_k, int) or not 1 <= top_k <= n:
        raise ValueError(f"num_experts_per_tok must be an int in [1, {n}], got {top_k!r}")
    return n


def moe_llama_config_from_hf(hf: dict[str, Any]) -> tuple[LlamaConfig, MoeSpec]:
    arch = next(a for a in hf.get("architectures") or [] if a in _DENSE_SIBLING)
    dense = {**hf, "architectures": [_DENSE_SIBLING[arch]]}
    if not hf.get("use_sliding_window", arch == MIXTRAL):  # Qwen-MoE folders write sliding_window 0 when off
        dense["sliding_window"] = None
    if arch == QWEN2_MOE:
        dense["attention_bias"] = hf.get("qkv_bias", True)
    cfg = config_from_hf(dense)
    n = num_routed_experts(hf)
    layers = cfg.num_layers
    if arch == MIXTRAL:
        sparse = tuple(range(layers))
    else:
        step, dense_only = hf.get("decoder_sparse_step") or 1, set(hf.get("mlp_only_layers") or [])
        sparse = tuple(i for i in range(layers) if i not in dense_only and (i + 1) % step == 0)
    shared = (hf.get("shared_expert_intermediate_size") or 0) if arch == QWEN2_MOE else 0
    spec = MoeSpec(
        num_experts=n,
        top_k=hf["num_experts_per_tok"],
        intermediate_size=hf["intermediate_size"] if arch == MIXTRAL else hf["moe_intermediate_size"],
        norm_topk_prob=True if arch == MIXTRAL else bool(hf.get("norm_topk_prob", False)),
        shared_intermediate_size=shared,
        shared_gate=bool(shared),
        sparse_layers=sparse,
    )
    return cfg, spec
