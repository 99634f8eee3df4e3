"""What a live weight update loads, on any tensor-parallel rank: rank 0 (runtime/weight_updates.py) and each
worker (distributed/worker.py) prepare the same update on their own shard, and nothing changes until every rank
has prepared it (a mismatch found on any rank leaves every rank on the old weights).

A prepared update is a function that copies the new weights in place (models/loading/weight_copy.py); it runs
between two steps, with no request running.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import torch

from .config import EngineConfig
from .distributed.group import TensorParallel
from .model_loading import load_model
from .models.loading.weight_copy import check_same_model, copy_model, plan_named_tensors

NamedTensors = list[tuple[str, torch.Tensor]]


@dataclass(frozen=True, slots=True)
class UpdateSource:
    """The new weights, as every rank is sent them: a checkpoint's path, or HF-named full (unsharded) tensors."""

    path: Path | None = None
    named_tensors: NamedTensors | None = None


def prepare(model: torch.nn.Module, source: UpdateSource, cfg: EngineConfig, tp: TensorParallel,
            device: torch.device) -> tuple[Callable[[], None], str]:
    """(the in-place copy of the new weights into this rank's `model`, what it does); ValueError naming the first
    mismatch, with nothing changed."""
    if source.named_tensors is not None:
        update = plan_named_tensors(model, source.named_tensors, cfg.load_quantization())
        return update.apply, f"updated {update.count} tensors"
    assert source.path is not None
    try:
        loaded = load_model(source.path, device, cfg.torch_dtype(), tp, quantization=cfg.load_quantization(),
                            ep_size=cfg.ep_size)
    except (FileNotFoundError, OSError) as e:
        raise ValueError(f"cannot load model_path {str(source.path)!r}: {e}") from None
    if loaded.vision is not None:
        raise ValueError(f"model_path {str(source.path)!r} is a vision-language model; the engine serves a text one")
    check_same_model(model, loaded.model)
    return functools.partial(copy_model, model, loaded.model), f"loaded the weights of {source.path}"
