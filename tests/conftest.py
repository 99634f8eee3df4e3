"""Shared fixtures: the real tokenizer, a tiny random-weight model folder that uses it, engines."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

if not torch.cuda.is_available():  # Triton kernels run in its interpreter on a CPU-only machine (CI)
    os.environ.setdefault("TRITON_INTERPRET", "1")

from radixlang.runtime.models.loader import default_model_path, gguf_metadata
from radixlang.runtime.tokenizer import Tokenizer

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

# SGLang's "character generator" regex: Unicode [\w\d\s]{1,16} fields in a JSON-like template
CHARACTER_REGEX = (
    r"""\{\n"""
    + r"""    "name": "[\w\d\s]{1,16}",\n"""
    + r"""    "house": "(Gryffindor|Slytherin|Ravenclaw|Hufflepuff)",\n"""
    + r"""    "blood status": "(Pure-blood|Half-blood|Muggle-born)",\n"""
    + r"""    "occupation": "(student|teacher|auror|ministry of magic|death eater|order of the phoenix)",\n"""
    + r"""    "wand": \{\n"""
    + r"""        "wood": "[\w\d\s]{1,16}",\n"""
    + r"""        "core": "[\w\d\s]{1,16}",\n"""
    + r"""        "length": [0-9]{1,2}\.[0-9]{0,2}\n"""
    + r"""    \},\n"""
    + r"""    "alive": "(Alive|Deceased)",\n"""
    + r"""    "patronus": "[\w\d\s]{1,16}",\n"""
    + r"""    "bogart": "[\w\d\s]{1,16}"\n"""
    + r"""\}"""
)


@pytest.fixture(scope="session")
def smollm_metadata() -> dict:
    import gguf

    return gguf_metadata(gguf.GGUFReader(str(default_model_path())))


@pytest.fixture(scope="session")
def tokenizer(smollm_metadata) -> Tokenizer:
    return Tokenizer.from_gguf_metadata(smollm_metadata)


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
    tokenizer.hf.save(str(path / "tokenizer.json"))
    eos = tokenizer.hf.id_to_token(tokenizer.eos_token_ids[0])
    (path / "tokenizer_config.json").write_text(
        json.dumps({"eos_token": eos, "chat_template": tokenizer.chat_template, "add_bos_token": False})
    )
    return path


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory, tokenizer) -> Path:
    """A 2-layer random Llama with SmolLM2's real tokenizer, as an HF folder."""
    path = tmp_path_factory.mktemp("tiny-llama")
    return write_hf_folder(path, TINY_CONFIG, tiny_weights(TINY_CONFIG), tokenizer)


@pytest.fixture
def tiny_engine_factory(tiny_model_dir):
    """Builds engines on the tiny model; each is checked for leaked KV and shut down afterwards."""
    from radixlang.runtime.engine import Engine

    engines = []

    def make(**options) -> Engine:
        options.setdefault("kv_cache_tokens", 4096)
        options.setdefault("device", "cpu")
        engine = Engine(model=str(tiny_model_dir), **options)
        engines.append(engine)
        return engine

    yield make
    for engine in engines:
        engine.check_invariants()
        engine.shutdown()


@pytest.fixture(scope="session")
def smollm_engine():
    """The real SmolLM2-135M-Instruct, shared by the end-to-end tests."""
    from radixlang.runtime.engine import Engine

    engine = Engine(device="cpu", kv_cache_tokens=16384)
    yield engine
    engine.check_invariants()
    engine.shutdown()
