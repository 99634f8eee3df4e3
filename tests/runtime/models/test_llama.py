"""The model through the engine (paged KV, batching) against a dense, cache-free forward written here."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from radixlang.runtime.models.loading.loader import unpermute_qk
from radixlang.runtime.models.rope import RopeScaling, rope_inv_freq

from ...conftest import TINY_CONFIG, tiny_weights, write_hf_folder


def dense_logits(w: dict[str, torch.Tensor], cfg: dict, ids: list[int]) -> torch.Tensor:
    """HF-Llama math, whole sequence at once, no KV cache: [len(ids), vocab]."""
    h, heads, kv_heads = cfg["hidden_size"], cfg["num_attention_heads"], cfg["num_key_value_heads"]
    d, n = h // heads, len(ids)

    def norm(x, weight):
        return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + cfg["rms_norm_eps"]))

    inv = 1.0 / (cfg["rope_theta"] ** (torch.arange(0, d, 2).float() / d))
    ang = torch.outer(torch.arange(n).float(), inv)
    cos, sin = torch.cat([ang.cos()] * 2, -1), torch.cat([ang.sin()] * 2, -1)

    def rope(x):  # [heads, n, d]
        rotated = torch.cat((-x[..., d // 2:], x[..., : d // 2]), -1)
        return x * cos + rotated * sin

    x = w["model.embed_tokens.weight"][ids]
    causal = torch.ones(n, n).tril().bool()
    for layer in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{layer}."
        a = norm(x, w[p + "input_layernorm.weight"])
        q = (a @ w[p + "self_attn.q_proj.weight"].T).view(n, heads, d).transpose(0, 1)
        k = (a @ w[p + "self_attn.k_proj.weight"].T).view(n, kv_heads, d).transpose(0, 1)
        v = (a @ w[p + "self_attn.v_proj.weight"].T).view(n, kv_heads, d).transpose(0, 1)
        q, k = rope(q), rope(k)
        k, v = k.repeat_interleave(heads // kv_heads, 0), v.repeat_interleave(heads // kv_heads, 0)
        scores = (q @ k.transpose(1, 2)) / math.sqrt(d)
        attn = scores.masked_fill(~causal, -torch.inf).softmax(-1) @ v
        x = x + attn.transpose(0, 1).reshape(n, h) @ w[p + "self_attn.o_proj.weight"].T
        m = norm(x, w[p + "post_attention_layernorm.weight"])
        gate, up = m @ w[p + "mlp.gate_proj.weight"].T, m @ w[p + "mlp.up_proj.weight"].T
        x = x + (F.silu(gate) * up) @ w[p + "mlp.down_proj.weight"].T
    return norm(x, w["model.norm.weight"]) @ w["lm_head.weight"].T


def dense_greedy(w, cfg, ids: list[int], steps: int) -> list[int]:
    ids, out = list(ids), []
    for _ in range(steps):
        out.append(int(dense_logits(w, cfg, ids)[-1].argmax()))
        ids.append(out[-1])
    return out


PROMPTS = ["The quick brown fox", "1, 2, 3, 4,", "<|im_start|>user\nHi there<|im_end|>\n", "x"]


@pytest.fixture(scope="module")
def weights():
    return tiny_weights(TINY_CONFIG)


def test_prompt_logprobs_match_dense_forward(tiny_engine_factory, tokenizer, weights):
    engine = tiny_engine_factory()
    for prompt in PROMPTS[:3]:
        ids = tokenizer.encode(prompt)
        out = engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 1},
                              return_logprob=True, logprob_start_len=0)
        ref = torch.log_softmax(dense_logits(weights, TINY_CONFIG, ids), -1)
        expected = [float(ref[i - 1, ids[i]]) for i in range(1, len(ids))]
        got = [lp.logprob for lp in out.meta.input_logprobs]
        assert np.allclose(got, expected, atol=1e-4)


def test_batched_greedy_decode_matches_dense_greedy(tiny_engine_factory, tokenizer, weights):
    engine = tiny_engine_factory()
    batch = [tokenizer.encode(p) for p in PROMPTS]
    outs = engine.generate(input_ids=batch, sampling_params={"max_new_tokens": 12, "temperature": 0,
                                                              "ignore_eos": True})
    for ids, out in zip(batch, outs):
        assert out.output_ids == dense_greedy(weights, TINY_CONFIG, ids, 12)


def test_unpermute_inverts_llama_cpp_permute():
    heads, d, cols = 3, 8, 5
    w = torch.randn(heads * d, cols)
    # llama.cpp's convert script: rows (heads, d/2, 2) -> (heads, 2, d/2)
    permuted = w.reshape(heads, 2, d // 2, cols).swapaxes(1, 2).reshape(heads * d, cols)
    assert torch.equal(unpermute_qk(permuted, heads), w)


def test_gguf_file_loads_like_hf_folder(tmp_path, tokenizer, smollm_metadata, weights):
    """Write the tiny model as a llama.cpp-style GGUF (permuted Q/K) and compare engine outputs."""
    from radixlang.runtime.engine import Engine

    from .gguf_tiny import Q, gguf_tensors, write_gguf

    def smollm_tokenizer(writer) -> None:
        writer.add_tokenizer_model("gpt2")
        writer.add_tokenizer_pre("smollm")
        writer.add_token_list(smollm_metadata["tokenizer.ggml.tokens"])
        writer.add_token_types(smollm_metadata["tokenizer.ggml.token_type"])
        writer.add_token_merges(smollm_metadata["tokenizer.ggml.merges"])
        writer.add_eos_token_id(2)

    cfg = TINY_CONFIG
    path = tmp_path / "tiny.gguf"
    write_gguf(path, cfg, gguf_tensors(cfg, weights, Q.F32, None)[0], smollm_tokenizer)

    hf_dir = write_hf_folder(tmp_path / "hf", cfg, weights, tokenizer)
    params = {"max_new_tokens": 8, "temperature": 0, "ignore_eos": True}
    outs = []
    for model in (path, hf_dir):
        with Engine(str(model), kv_cache_tokens=512, device="cpu") as engine:
            outs.append(engine.generate("The quick brown fox", params).output_ids)
            engine.check_invariants()
    assert outs[0] == outs[1]


def test_llama3_rope_scaling_keeps_high_frequencies():
    base = rope_inv_freq(RopeScaling(theta=500000.0), 64)
    scaled = rope_inv_freq(RopeScaling("llama3", 500000.0, factor=8.0, original_max_position=8192,
                                       low_freq_factor=1.0, high_freq_factor=4.0), 64)
    assert torch.allclose(scaled[:4], base[:4])  # short wavelengths untouched
    assert torch.allclose(scaled[-1], base[-1] / 8.0)  # long wavelengths divided by the factor
