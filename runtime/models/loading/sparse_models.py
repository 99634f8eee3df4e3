"""Building the mixture-of-experts and MLA architectures from HF folders (the loader dispatches here by
architecture)."""
from __future__ import annotations

from pathlib import Path

import torch

from ...distributed.group import TensorParallel
from ...tokenizer import Tokenizer
from ..deepseek import DeepseekForCausalLM, MLARotary
from ..deepseek_config import DEEPSEEK_ARCHS, deepseek_config_from_hf
from ..llama import Rotary
from ..moe import Router
from ..moe_config import MOE_LLAMA_ARCHS, moe_llama_config_from_hf
from ..moe_llama import MoeLlamaForCausalLM
from .gguf_deepseek import DEEPSEEK_GGUF_ARCH
from .gguf_file import read_gguf
from .loader import LoadedModel, deepseek_weights, gguf_to_hf_config, gguf_weights, read_hf_config, read_hf_dir

SPARSE_ARCHS = MOE_LLAMA_ARCHS + DEEPSEEK_ARCHS


def load_sparse_model(path: Path, device: torch.device, dtype: torch.dtype,
                      tp: TensorParallel | None = None, expert_parallel: bool = True,
                      dp_attention: bool = False) -> LoadedModel:
    """`expert_parallel`: over several `tp` ranks, partition the experts (else slice each one).
    `dp_attention`: attention and the dense layers whole on every rank, each running its own requests."""
    hf = read_hf_config(path)
    if any(a in DEEPSEEK_ARCHS for a in hf.get("architectures") or []):
        cfg, weights, tokenizer = read_hf_dir(path, hf, read_config=deepseek_config_from_hf)
        with torch.device("meta"):
            model: DeepseekForCausalLM | MoeLlamaForCausalLM = DeepseekForCausalLM(cfg, tp, expert_parallel, dp_attention)
        rotary: MLARotary | Rotary = MLARotary(cfg)
    else:
        (cfg, spec), weights, tokenizer = read_hf_dir(path, hf, read_config=moe_llama_config_from_hf)
        with torch.device("meta"):
            model = MoeLlamaForCausalLM(cfg, spec, tp, expert_parallel, dp_attention)
        rotary = Rotary(cfg)
    return _finish(model, rotary, weights, device, dtype, tokenizer, path.name)


def load_moe_gguf(path: Path, device: torch.device, dtype: torch.dtype, tp: TensorParallel | None = None,
                  expert_parallel: bool = True, dp_attention: bool = False) -> LoadedModel:
    """A mixture-of-experts GGUF (llama.cpp's Mixtral as `llama` with `expert_count`, `qwen2moe`, `qwen3moe`,
    and DeepSeek-V2 / V3 as `deepseek2`): the config read as its config.json would be, the stacked
    `ffn_*_exps` as per-expert weights."""
    gguf = read_gguf(path)
    arch = gguf.metadata["general.architecture"]  # a MoE GGUF: found by its `{arch}.expert_count`
    names = {t.name for t in gguf.tensors}
    tokenizer = Tokenizer.from_gguf_metadata(gguf.metadata)
    hf = gguf_to_hf_config(gguf.metadata, arch, names)
    if arch == DEEPSEEK_GGUF_ARCH:
        ds_cfg = deepseek_config_from_hf(hf)
        with torch.device("meta"):
            ds_model = DeepseekForCausalLM(ds_cfg, tp, expert_parallel, dp_attention)
        return _finish(ds_model, MLARotary(ds_cfg), deepseek_weights(gguf), device, dtype, tokenizer, path.stem)
    cfg, spec = moe_llama_config_from_hf(hf)
    with torch.device("meta"):
        model = MoeLlamaForCausalLM(cfg, spec, tp, expert_parallel, dp_attention)
    return _finish(model, Rotary(cfg), gguf_weights(gguf, cfg, arch), device, dtype, tokenizer, path.stem)


def _finish(model, rotary, weights, device: torch.device, dtype: torch.dtype, tokenizer: Tokenizer,
            name: str) -> LoadedModel:
    """Materialises the meta-built model, loads `weights`, casts, and resets the MoE blocks."""
    model = model.to_empty(device=device)
    model.load_weights(weights)
    _cast(model, dtype, keep_routers=isinstance(model, DeepseekForCausalLM))
    model.rotary = rotary.to(device)  # fp32 tables, computed rather than loaded
    for block in model.moe_blocks():
        block.reset()
    return LoadedModel(model.eval(), tokenizer, name)


def _cast(model: torch.nn.Module, dtype: torch.dtype, keep_routers: bool) -> None:
    """model.to(dtype), but with `keep_routers` the routers stay fp32, as transformers keeps DeepSeek's
    gate and e_score_correction_bias (expert choices hinge on small score differences)."""
    for module in model.modules():
        if keep_routers and isinstance(module, Router):
            continue
        for param in module.parameters(recurse=False):
            param.data = param.data.to(dtype) if param.is_floating_point() else param.data
