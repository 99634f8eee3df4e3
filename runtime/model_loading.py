"""Which loader a model path needs: a vision-language HF folder goes to multimodal/, a mixture-of-experts or
MLA folder to models/loading/sparse_models.py, the rest (GGUF files, dense language-model folders) to models/."""
from __future__ import annotations

from collections.abc import Collection
from pathlib import Path

import torch

from .distributed.group import TensorParallel
from .models.llama import use_fixed_order
from .models.loading.loader import LoadedModel, default_model_path, is_moe_gguf, load_language_model, read_hf_config
from .models.loading.sparse_models import SPARSE_ARCHS, load_moe_gguf, load_sparse_model
from .multimodal.loader import VISION_ARCHS, load_vision_language


def load_model(path: str | Path | None, device: torch.device, dtype: torch.dtype,
               tp: TensorParallel | None = None, keep_blocks: bool = False,
               quantization: str = "none", ep_size: int | None = None, dp_attention: bool = False) -> LoadedModel:
    """`tp`: load only this tensor-parallel rank's shard of the weights. `keep_blocks`: also return a GGUF's
    Q4_0 / Q4_1 / Q8_0 weights as stored (for packed kernels). `quantization`: a mode of
    config.QUANTIZATIONS, applied to language models (vision and MoE / MLA models load as stored). `ep_size`:
    MoE experts over the `tp` ranks (EngineConfig.ep_size). `dp_attention` (EngineConfig.enable_dp_attention):
    a MoE model with attention whole on every rank; any other model is refused."""
    loaded = _load(Path(path) if path is not None else default_model_path(), device, dtype, tp, keep_blocks,
                   quantization, ep_size, dp_attention)
    # fp32 CPU linears in one reduction order whatever the batch (issue 43), decided here once for the engine's life
    use_fixed_order(loaded.model)
    return loaded


def _load(path: Path, device: torch.device, dtype: torch.dtype, tp: TensorParallel | None, keep_blocks: bool,
          quantization: str, ep_size: int | None, dp_attention: bool) -> LoadedModel:
    if path.is_dir() and is_vision_folder(path):
        _refuse_dp_attention(dp_attention, path)
        return load_vision_language(path, device, dtype, tp)
    if path.is_dir() and _has_architecture(path, SPARSE_ARCHS):  # MoE / MLA: their own modules
        return load_sparse_model(path, device, dtype, tp, ep_size != 1, dp_attention)
    if path.suffix == ".gguf" and path.is_file() and is_moe_gguf(path):
        return load_moe_gguf(path, device, dtype, tp, ep_size != 1, dp_attention)
    _refuse_dp_attention(dp_attention, path)
    return load_language_model(path, device, dtype, tp, keep_blocks, quantization)


def _refuse_dp_attention(dp_attention: bool, path: Path) -> None:
    if dp_attention:
        raise ValueError(f"enable_dp_attention needs a mixture-of-experts language model (the ranks share its "
                         f"experts); {path.name} is not one")


def is_vision_folder(path: Path) -> bool:
    return _has_architecture(path, VISION_ARCHS)


def _has_architecture(path: Path, archs: Collection[str]) -> bool:
    return (path / "config.json").exists() and any(
        a in archs for a in read_hf_config(path).get("architectures") or [])
