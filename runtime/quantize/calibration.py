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


def calibration_samples(tokenizer: Tokenizer, text: str, seq_len: int, max_samples: int) -> list[torch.Tensor]:
    """Consecutive windows of `seq_len` tokens (the last may be shorter), at most `max_samples`."""
    ids = tokenizer.encode(text)
    windows = [ids[i:i + seq_len] for i in range(0, len(ids), seq_len)][:max_samples]
    return [torch.tensor(w) for w in windows if len(w) >= MIN_TOKENS]
