"""Calibration samples: token windows of shipped text (`builtin`) or of a user's text file.

The builtin text (calibration.txt, written for radixlang) mixes what a chat model is asked about:
encyclopedic prose on several subjects, instructions, code (Python, SQL, JSON), arithmetic, a story, a
business report, a speech, a little French, and user/assistant exchanges. GPTQ and SmoothQuant need the
typical size and correlation of each layer's inputs, not facts, and these are set by such varied text;
the benchmark's held-out text (benchmark/fidelity.py) is not in it.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..tokenizer import Tokenizer

BUILTIN = Path(__file__).with_name("calibration.txt")
MIN_TOKENS = 32  # a trailing window shorter than this is dropped


def calibration_text(source: str) -> str:
    path = BUILTIN if source == "builtin" else Path(source)
    if not path.is_file():
        raise ValueError(f"--calib must be 'builtin' or a text file, got {source!r}")
    text = path.read_text()
    if not text.strip():
        raise ValueError(f"--calib file {source!r} is empty")
    return text


def generated_samples(model_path: Path, text: str, count: int, new_tokens: int) -> list[torch.Tensor]:
    """`count` samples the model writes itself (temperature 1, seeded) after the opening words of the
    text's paragraphs: its own distribution, and enough tokens that each layer's H = 2XX^T is well
    determined (the shipped text alone, ~2k tokens, is fewer than SmolLM2's 1536 MLP channels need)."""
    from ..engine import Engine

    paragraphs = [p.strip() for p in text.split("\n\n") if p.strip()]
    prompts = [" ".join(paragraphs[i % len(paragraphs)].split()[:8 + i // len(paragraphs)]) for i in range(count)]
    with Engine(model=str(model_path), device="cpu", kv_cache_tokens=count * (new_tokens + 64)) as engine:
        outs = engine.generate(input_ids=[engine.tokenizer.encode(p) for p in prompts], sampling_params={
            "temperature": 1.0, "max_new_tokens": new_tokens, "seed": 0, "ignore_eos": True})
        assert isinstance(outs, list), "a batch of prompts gives a list of completions"
        return [torch.tensor(engine.tokenizer.encode(p) + o.output_ids) for p, o in zip(prompts, outs)]


def calibration_samples(tokenizer: Tokenizer, text: str, seq_len: int, max_samples: int) -> list[torch.Tensor]:
    """Consecutive windows of `seq_len` tokens (the last may be shorter), at most `max_samples`."""
    ids = tokenizer.encode(text)
    windows = [ids[i:i + seq_len] for i in range(0, len(ids), seq_len)][:max_samples]
    return [torch.tensor(w) for w in windows if len(w) >= MIN_TOKENS]
