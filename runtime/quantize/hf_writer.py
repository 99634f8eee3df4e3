"""Writes a quantized model as an HF folder: config.json with its quantization_config, model.safetensors
under transformers' names (fused q/k/v and gate/up split back), and the tokenizer."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

from ..models.linear.quant_formats import IntWeight, write_awq, write_gptq
from ..models.llama import LlamaForCausalLM
from ..models.loading.loader import LoadedModel, source_hf_config
from .layerwise import linear_weight

_SPLITS = {"self_attn.qkv_proj": ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj"),
           "mlp.gate_up_proj": ("mlp.gate_proj", "mlp.up_proj")}
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "generation_config.json",
                    "chat_template.jinja")
Packed = IntWeight | tuple[torch.Tensor, torch.Tensor]  # weight-only codes, or W8A8 (int8 rows, scales)


def write_folder(out: Path, model_path: Path, loaded: LoadedModel, packed: dict[str, Packed],
                 quantization_config: dict[str, Any]) -> Path:
    """`packed`: the model's fused linears by module name (layers.3.self_attn.qkv_proj)."""
    out.mkdir(parents=True, exist_ok=True)
    config = {k: v for k, v in source_hf_config(model_path).items() if k != "quantization_config"}
    if getattr(loaded.model, "lm_head", None) is not None:  # its own head (rotation.py unties a tied one)
        config["tie_word_embeddings"] = False
    (out / "config.json").write_text(json.dumps(config | {"quantization_config": quantization_config}, indent=2))
    awq = quantization_config["quant_method"] == "awq"
    save_file(hf_tensors(loaded.model, packed, awq), str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_tokenizer(out, model_path, loaded)
    return out


def hf_tensors(model: LlamaForCausalLM, packed: dict[str, Packed], awq: bool = False) -> dict[str, torch.Tensor]:
    """`awq`: the codes in AWQ's layout (GEMM packing, zeros as they are), else GPTQ's v1."""
    tensors: dict[str, torch.Tensor] = {}
    for name, param in model.named_parameters():
        module, _, kind = name.rpartition(".")
        if module in packed and kind == "weight":
            continue
        tensors |= {hf_name: part.contiguous() for hf_name, part in _split(name, param.detach(), model)}
    for module, weights in packed.items():
        for hf_module, part in _split_packed(module, weights, model, awq):
            tensors |= {f"model.{hf_module}.{k}": v.contiguous() for k, v in part.items()}
    return tensors


def _split(name: str, t: torch.Tensor, model: LlamaForCausalLM) -> list[tuple[str, torch.Tensor]]:
    """HF names and tensors of one of the model's parameters (fused ones split back into their parts)."""
    module, _, kind = name.rpartition(".")
    layer, _, rest = module.partition(".")[2].partition(".")
    if not module.startswith("layers.") or rest not in _SPLITS:
        return [(name if module == "lm_head" else f"model.{name}", t)]
    parts = t.split(_part_rows(model, rest))
    return [(f"model.layers.{layer}.{hf}.{kind}", p) for hf, p in zip(_SPLITS[rest], parts)]


def _split_packed(module: str, weights: Packed, model: LlamaForCausalLM,
                  awq: bool) -> list[tuple[str, dict[str, torch.Tensor]]]:
    layer, _, rest = module.partition(".")[2].partition(".")
    sizes = _part_rows(model, rest)
    names = [f"layers.{layer}.{hf}" for hf in _SPLITS.get(rest, (rest,))]
    if isinstance(weights, IntWeight):
        parts = [IntWeight(c, z, s, weights.g_idx, weights.bits) for c, z, s in
                 zip(weights.codes.split(sizes), weights.zeros.split(sizes), weights.scales.split(sizes))]
        return [(n, write_awq(p) if awq else write_gptq(p, zero_offset=1)) for n, p in zip(names, parts)]
    codes, scales = weights
    return [(n, {"weight": c.to(torch.int8), "weight_scale": s.float()})
            for n, c, s in zip(names, codes.split(sizes), scales.split(sizes))]


def _part_rows(model: LlamaForCausalLM, rest: str) -> list[int]:
    cfg = model.config
    if rest == "self_attn.qkv_proj":
        kv = cfg.num_kv_heads * cfg.head_dim
        return [cfg.num_heads * cfg.head_dim, kv, kv]
    if rest == "mlp.gate_up_proj":
        return [cfg.intermediate_size, cfg.intermediate_size]
    return [linear_weight(model, f"layers.0.{rest}").shape[0]]


def _write_tokenizer(out: Path, model_path: Path, loaded: LoadedModel) -> None:
    if model_path.is_dir():
        for name in _TOKENIZER_FILES:
            if (model_path / name).exists():
                shutil.copy(model_path / name, out / name)
        return
    tok = loaded.tokenizer
    tok.hf.save(str(out / "tokenizer.json"))
    eos = tok.hf.id_to_token(tok.eos_token_ids[0]) if tok.eos_token_ids else None
    bos = tok.hf.id_to_token(tok.bos_token_id) if tok.bos_token_id is not None else None
    cfg = {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": eos, "bos_token": bos,
           "add_bos_token": tok.add_bos, "chat_template": tok.chat_template}
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=2))
