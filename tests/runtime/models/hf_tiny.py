"""Tiny random-weight models built and saved by transformers itself, with a small byte-level tokenizer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from tokenizers import AddedToken, decoders, models, pre_tokenizers
from tokenizers import Tokenizer as HFTokenizer

from radixlang.runtime.tokenizer import bytes_to_unicode

# the special tokens of every family the chat-template tests render
SPECIAL_TOKENS = ["<s>", "</s>", "<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>",
                  "<|eot_id|>", "<|eom_id|>", "<|python_tag|>", "<|im_start|>", "<|im_end|>", "<|endoftext|>",
                  "[INST]", "[/INST]", "<think>", "</think>", "<tool_call>", "</tool_call>", "[TOOL_CALLS]"]
VOCAB_SIZE = 288  # 256 bytes + the specials, rounded up as checkpoints pad their embeddings
BASE = dict(vocab_size=VOCAB_SIZE, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256, rms_norm_eps=1e-5)


@pytest.fixture(scope="module")
def one_thread():
    """Runs a module's tests on one intra-op thread: tiny shapes gain nothing from more, and where the host is
    busy (a shared CI runner; worker ranks beside the test process) threads spin-waiting on each other make
    every op many times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def byte_tokenizer() -> HFTokenizer:
    """Byte-level BPE without merges: one token per byte, plus the family special tokens."""
    vocab = {ch: i for i, ch in enumerate(bytes_to_unicode().values())}
    tok = HFTokenizer(models.BPE(vocab=vocab, merges=[], fuse_unk=False))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return tok


def write_tokenizer(path: Path, bos: str, eos: str, chat_template: str | None = None) -> None:
    byte_tokenizer().save(str(path / "tokenizer.json"))
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "bos_token": bos, "eos_token": eos,
           "add_bos_token": False}
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))


@torch.no_grad()
def sharpen(model: torch.nn.Module, seed: int, gain: float = 3.0) -> None:
    """Redraws every weight so outputs are far from uniform: greedy decoding is then a sharp test,
    attention depends on position (RoPE matters), and norm weights and biases are not the identity.
    `gain` scales the matrices (times fan_in ** -0.5): the higher, the sharper, and the more fp32 rounding
    is amplified on the way to the logits."""
    g = torch.Generator().manual_seed(seed)
    for name, p in model.named_parameters():
        noise = torch.randn(p.shape, generator=g)
        if name.endswith("norm.weight"):
            p.copy_(1.0 + 0.2 * noise)
        elif name.endswith("bias"):
            p.copy_(0.5 * noise)
        elif "embed_tokens" in name or "lm_head" in name:
            p.copy_(noise * (1.0 if "embed" in name else 2.0))
        else:
            p.copy_(noise * gain * p.shape[1] ** -0.5)


def save_hf_model(path: Path, config, seed: int = 0, bos: str = "<s>", eos: str = "</s>",
                  gain: float = 3.0) -> torch.nn.Module:
    """Builds the transformers model for `config`, sharpens it, saves it as safetensors; returns it (fp32, eval)."""
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config, attn_implementation="eager", dtype=torch.float32)
    sharpen(model, seed, gain)
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(path), safe_serialization=True)
    write_tokenizer(path, bos, eos)
    return model.eval()
