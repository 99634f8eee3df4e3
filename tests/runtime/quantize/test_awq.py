"""AWQ's scale search on one linear, against the test suite's own round-to-nearest (quant_folders.rtn_groups):
on inputs with a few large channels, as LLM activations have, scaling those channels' weights up before
rounding lowers the output error on held-out inputs, and the search finds such a scale."""
from __future__ import annotations

import torch

from radixlang.runtime.quantize.awq import search_scales
from radixlang.runtime.quantize.gptq import GPTQSpec

from ..models.quant_folders import rtn_groups

K, GROUP = 256, 64


def inputs(rows: int, seed: int) -> torch.Tensor:
    """Every 16th channel 20x larger than the rest (the same channels in every sample)."""
    x = torch.randn(rows, K, generator=torch.Generator().manual_seed(seed))
    return x * (1 + 19 * (torch.arange(K) % 16 == 0))


def rtn(w: torch.Tensor) -> torch.Tensor:
    codes, zeros, scales = rtn_groups(w, 4, GROUP, torch.arange(K) // GROUP)
    return scales.float().repeat_interleave(GROUP, dim=1) * (codes - zeros.repeat_interleave(GROUP, dim=1))


def test_awq_scales_lower_the_output_error_of_round_to_nearest_on_held_out_inputs():
    calib, held_out = inputs(1024, seed=1), inputs(256, seed=2)
    w = torch.randn(48, K, generator=torch.Generator().manual_seed(3)) / K**0.5
    s, alpha = search_scales(w, calib.T @ calib, calib.abs().mean(dim=0), GPTQSpec(group_size=GROUP))
    assert alpha > 0 and s[::16].min() > s.max() / 4  # the large channels' weights scaled up the most

    def error(dequantized: torch.Tensor) -> float:
        return (held_out @ (dequantized - w).T).pow(2).mean().item()

    plain, scaled = error(rtn(w)), error(rtn(w * s) / s)  # the scaled rounding, undone at the input
    print(f"alpha {alpha}: held-out output mse rtn {plain:.4e}, awq {scaled:.4e}")
    assert scaled < 0.8 * plain
