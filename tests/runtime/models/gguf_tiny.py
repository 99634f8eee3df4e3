"""Writing GGUF files the way llama.cpp's converter does, from weights saved in transformers' layout."""
from __future__ import annotations

from typing import Callable

import gguf
import numpy as np
import torch

from radixlang.runtime.tokenizer import bytes_to_unicode

from .hf_tiny import SPECIAL_TOKENS

Q = gguf.GGMLQuantizationType
K_QUANTS = [Q.Q4_K, Q.Q5_K, Q.Q6_K]  # gguf only dequantizes these: the test writes raw blocks
LAYER_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
               "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v",
               "self_attn.o_proj": "attn_output", "self_attn.q_norm": "attn_q_norm",
               "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up",
               "mlp.down_proj": "ffn_down"}
TOP_NAMES = {"embed_tokens": "token_embd", "norm": "output_norm", "lm_head": "output"}
GGUF_ARCH = {"LlamaForCausalLM": "llama", "MistralForCausalLM": "mistral", "Qwen2ForCausalLM": "qwen2",
             "Qwen3ForCausalLM": "qwen3", "MixtralForCausalLM": "llama", "Qwen2MoeForCausalLM": "qwen2moe",
             "Qwen3MoeForCausalLM": "qwen3moe"}


def gguf_name(hf_name: str) -> str:
    parts = hf_name.removeprefix("model.").split(".")
    if parts[0] == "layers":
        return f"blk.{parts[1]}.{LAYER_NAMES['.'.join(parts[2:-1])]}.{parts[-1]}"
    return f"{TOP_NAMES[parts[0]]}.{parts[1]}"


def permute_qk(w: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's convert-time permute of Llama Q/K rows (for its interleaved RoPE)."""
    return w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def random_k_blocks(qtype, rows: int, cols: int, rng: np.random.Generator) -> np.ndarray:
    """Valid raw K-quant blocks: random quants and scales, finite fp16 super-block scales."""
    block_values, block_bytes = gguf.GGML_QUANT_SIZES[qtype]
    blocks = rng.integers(0, 256, (rows * cols // block_values, block_bytes), dtype=np.uint8)
    scale = (rng.random((blocks.shape[0], 1)) * 0.02 + 0.005).astype(np.float16).view(np.uint8)
    if qtype == Q.Q6_K:
        blocks[:, -2:] = scale
    else:
        blocks[:, 0:2], blocks[:, 2:4] = scale, scale  # d and dmin
    return blocks.reshape(rows, -1)


def byte_tokenizer_metadata(writer: gguf.GGUFWriter) -> None:
    """hf_tiny's byte-level tokenizer as GGUF metadata (one merge: gguf needs the key)."""
    tokens = list(bytes_to_unicode().values()) + SPECIAL_TOKENS + ["ab"]
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("default")
    writer.add_token_list(tokens)
    writer.add_token_types([1] * 256 + [3] * len(SPECIAL_TOKENS) + [1])
    writer.add_token_merges(["a b"])
    writer.add_eos_token_id(257)


def write_gguf(path, hf: dict, tensors: dict[str, tuple[np.ndarray, object]],
               tokenizer_metadata: Callable[[gguf.GGUFWriter], None] = byte_tokenizer_metadata) -> None:
    """Writes what llama.cpp's converter writes for this config.json; tensors are (data, raw dtype or None)."""
    arch = GGUF_ARCH[hf["architectures"][0]]
    rope = hf.get("rope_parameters") or {"rope_type": "default", "rope_theta": hf["rope_theta"]}
    writer = gguf.GGUFWriter(str(path), arch)
    add_base_metadata(writer, hf, hf["num_key_value_heads"])
    writer.add_key_length(hf.get("head_dim") or hf["hidden_size"] // hf["num_attention_heads"])
    if rope["rope_type"] in ("linear", "yarn"):
        writer.add_rope_scaling_type(gguf.RopeScalingType(rope["rope_type"]))
        writer.add_rope_scaling_factor(rope["factor"])
        if rope["rope_type"] == "yarn":
            writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
    experts = hf.get("num_local_experts") or hf.get("num_experts")
    if experts:  # llama.cpp writes Mixtral as `llama` with these keys
        writer.add_expert_count(experts)
        writer.add_expert_used_count(hf["num_experts_per_tok"])
        if "moe_intermediate_size" in hf:
            writer.add_expert_feed_forward_length(hf["moe_intermediate_size"])
        if hf.get("shared_expert_intermediate_size"):
            writer.add_expert_shared_feed_forward_length(hf["shared_expert_intermediate_size"])
    if hf.get("sliding_window"):  # not all converters write it (nor a 0: off); the loader reads it if there
        writer.add_sliding_window(hf["sliding_window"])
    tokenizer_metadata(writer)
    for name, (data, raw_dtype) in tensors.items():
        writer.add_tensor(name, data, raw_dtype=raw_dtype)
    write_out(writer)


def add_base_metadata(writer: gguf.GGUFWriter, hf: dict, kv_heads: int) -> None:
    """The keys every architecture's converter writes."""
    writer.add_block_count(hf["num_hidden_layers"])
    writer.add_context_length(hf["max_position_embeddings"])
    writer.add_embedding_length(hf["hidden_size"])
    writer.add_feed_forward_length(hf["intermediate_size"])
    writer.add_head_count(hf["num_attention_heads"])
    writer.add_head_count_kv(kv_heads)
    writer.add_rope_freq_base((hf.get("rope_parameters") or hf)["rope_theta"])
    writer.add_layer_norm_rms_eps(hf["rms_norm_eps"])
    writer.add_vocab_size(hf["vocab_size"])


def write_out(writer: gguf.GGUFWriter) -> None:
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def gguf_tensors(hf: dict, weights: dict[str, torch.Tensor], qtype, rng) -> tuple[dict, dict]:
    """The GGUF tensors (2-D ones in `qtype`) and the HF-named fp32 weights they dequantize to."""
    permuted = hf["architectures"][0] in ("LlamaForCausalLM", "MistralForCausalLM")
    tensors, expected = {}, {}
    for name, w in weights.items():
        if name == "lm_head.weight" and hf["tie_word_embeddings"]:  # llama.cpp leaves out a tied head
            continue
        w = w.float().numpy()
        if w.ndim == 1:
            tensors[gguf_name(name)], expected[name] = (w, None), torch.from_numpy(w)
            continue
        heads = {".q_proj.": hf["num_attention_heads"], ".k_proj.": hf["num_key_value_heads"]}
        qk_heads = next((h for key, h in heads.items() if key in name), None) if permuted else None
        src = w if qk_heads is None else permute_qk(w, qk_heads)
        if qtype in K_QUANTS:
            raw = random_k_blocks(qtype, *w.shape, rng)
        elif qtype in (Q.F32, Q.F16):
            raw = src.astype(np.float16 if qtype == Q.F16 else np.float32)
        else:
            raw = gguf.quants.quantize(src, qtype)
        values = gguf.quants.dequantize(raw, qtype).reshape(w.shape).astype(np.float32)
        if qk_heads is not None:  # the file holds permuted rows: the HF weight is them un-permuted
            values = values.reshape(qk_heads, -1, 2, w.shape[1]).swapaxes(1, 2).reshape(w.shape)
        expected[name] = torch.from_numpy(np.ascontiguousarray(values))
        tensors[gguf_name(name)] = (raw, None if qtype in (Q.F32, Q.F16) else qtype)
    return tensors, expected
