"""HF transformers on the weights radixlang serves: the baseline model the benchmarks compare against.

Needs `transformers` (the `test` extra), and for a GGUF file `accelerate` (the `bench` extra). A GGUF file
is dequantised to fp32, as radixlang loads it; an HF folder (config.json + safetensors) loads in fp32.
"""
from __future__ import annotations

import importlib.util
from pathlib import Path

import torch


def load_causal_lm(model_path: str | Path, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    path = Path(model_path)
    if path.suffix == ".gguf":
        if importlib.util.find_spec("accelerate") is None:
            raise ImportError("transformers needs accelerate to load a GGUF file: pip install -e '.[bench]'")
        model = AutoModelForCausalLM.from_pretrained(str(path.parent), gguf_file=path.name, dtype=torch.float32)
    else:
        model = AutoModelForCausalLM.from_pretrained(str(path), dtype=torch.float32)
    return model.to(device).eval()
