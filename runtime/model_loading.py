"""Which loader a model path needs: a vision-language HF folder goes to multimodal/, the rest (GGUF files,
language-model folders) to models/."""
from __future__ import annotations

from pathlib import Path

import torch

from .distributed.group import TensorParallel
from .models.loader import LoadedModel, default_model_path, load_language_model, read_hf_config
from .multimodal.loader import VISION_ARCHS, load_vision_language


def load_model(path: str | Path | None, device: torch.device, dtype: torch.dtype,
               tp: TensorParallel | None = None, keep_blocks: bool = False) -> LoadedModel:
    """`tp`: load only this tensor-parallel rank's shard of the weights. `keep_blocks`: also return a GGUF's
    Q4_0 / Q4_1 / Q8_0 weights as stored (for packed kernels)."""
    path = Path(path) if path is not None else default_model_path()
    if path.is_dir() and is_vision_folder(path):
        return load_vision_language(path, device, dtype, tp)
    return load_language_model(path, device, dtype, tp, keep_blocks)


def is_vision_folder(path: Path) -> bool:
    return (path / "config.json").exists() and any(
        a in VISION_ARCHS for a in read_hf_config(path).get("architectures") or [])
