"""An HF config.json -> LlamaConfig, with each architecture's differences as transformers models them."""
from __future__ import annotations

import logging
from typing import Any

from ..llama import LlamaConfig
from ..rope import rope_from_hf

logger = logging.getLogger(__name__)

LLAMA, MISTRAL, QWEN2, QWEN3 = "LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"
SUPPORTED_HF_ARCHS = (LLAMA, MISTRAL, QWEN2, QWEN3)
# transformers' class defaults, for config.json files that leave the field out
_DEFAULT_MAX_POSITION = {LLAMA: 2048, MISTRAL: 4096 * 32, QWEN2: 32768, QWEN3: 32768}
_DEFAULT_WINDOW = 4096


def config_from_hf(hf: dict[str, Any]) -> LlamaConfig:
    arch = _architecture(hf)
    act = hf.get("hidden_act", "silu")
    if act != "silu":
        raise ValueError(f"hidden_act {act!r} is not supported; this model family uses 'silu'")
    heads = hf["num_attention_heads"]
    layers = hf["num_hidden_layers"]
    max_position = hf.get("max_position_embeddings") or _DEFAULT_MAX_POSITION[arch]
    window = _sliding_window(hf, arch, layers)
    bias = bool(hf.get("attention_bias", False))
    if window is not None and window < max_position:
        logger.warning("%s uses a %d-token sliding window; the context is capped there, where it equals "
                       "full attention (max_position_embeddings is %d)", arch, window, max_position)
    return LlamaConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=layers,
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads") or heads,
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        max_position=min(max_position, window or max_position),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope=rope_from_hf({**hf, "max_position_embeddings": max_position}),
        tie_word_embeddings=bool(hf.get("tie_word_embeddings", False)),
        qkv_bias={QWEN2: True, MISTRAL: False}.get(arch, bias),
        o_bias=bias and arch in (LLAMA, QWEN3),
        mlp_bias=bool(hf.get("mlp_bias", False)) and arch == LLAMA,
        qk_norm=arch == QWEN3,
        sliding_window=window,
    )


def _architecture(hf: dict[str, Any]) -> str:
    archs = hf.get("architectures") or []
    known = [a for a in archs if a in SUPPORTED_HF_ARCHS]
    if not known:
        raise ValueError(f"architectures {archs} not supported; expected one of {list(SUPPORTED_HF_ARCHS)}")
    return known[0]


def _sliding_window(hf: dict[str, Any], arch: str, num_layers: int) -> int | None:
    """The window of any sliding-attention layer, or None when every layer attends to the whole context."""
    window = hf.get("sliding_window", _DEFAULT_WINDOW)
    if window is None or arch == LLAMA:
        return None
    if not isinstance(window, int) or isinstance(window, bool) or window < 1:
        raise ValueError(f"sliding_window must be a positive int or null, got {window!r}")
    if arch == MISTRAL:
        return window
    if not hf.get("use_sliding_window", False):  # Qwen: the window is off unless switched on
        return None
    first = hf.get("max_window_layers", 28)
    types = hf.get("layer_types") or ["sliding_attention" if i >= first else "full_attention" for i in range(num_layers)]
    return window if "sliding_attention" in types else None
