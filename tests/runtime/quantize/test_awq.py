"""AWQ's scale search on one linear, against the test suite's own round-to-nearest (quant_folders.rtn_groups):
on inputs with a few large channels, as LLM activations have, scaling those channels' weights up before
rounding lowers the output error on held-out inputs, and the search finds such a scale."""
from __future__ import annotations

import torch
import transformers

from radixlang.runtime.model_loading import load_model
from radixlang.runtime.quantize import awq
from radixlang.runtime.quantize.awq import ALPHA_GRID, ALPHA_TOLERANCE, search_scales
from radixlang.runtime.quantize.gptq import GPTQSpec

from ..models.hf_tiny import BASE, save_hf_model
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


def test_the_search_keeps_the_largest_alpha_within_the_tolerance_of_the_least_error():
    """Brute force over the grid, each alpha's output error ||X (W - Q(W s) / s)^T||^2 computed from the
    inputs X themselves with the suite's own round-to-nearest: the search keeps the largest alpha whose
    error is within ALPHA_TOLERANCE of the least (and its scales)."""
    x = inputs(512, seed=7).double()  # seeds where the least error and the alpha kept differ
    w = (torch.randn(48, K, generator=torch.Generator().manual_seed(8)) / K**0.5).double()
    mean = x.abs().mean(dim=0)
    errors = {}
    for alpha in ALPHA_GRID:
        s = mean.pow(alpha)
        s = s / (s.max() * s.min()).sqrt()
        errors[alpha] = (x @ (rtn(w * s) / s - w).T).square().sum().item()
    want = max(a for a, e in errors.items() if e <= (1 + ALPHA_TOLERANCE) * min(errors.values()))
    s, alpha = search_scales(w, x.T @ x, mean, GPTQSpec(group_size=GROUP))
    least = min(errors, key=errors.__getitem__)
    print(f"least error at alpha {least}, kept {alpha}")
    assert alpha == want > least
    torch.testing.assert_close(s, mean.pow(want) / (mean.pow(want).max() * mean.pow(want).min()).sqrt())


def test_the_scales_statistic_is_each_input_channels_mean_magnitude_over_the_calibration_tokens(tmp_path, monkeypatch):
    """awq_layers hands the scale search each linear's mean |x| per input channel, over every
    calibration token (o_proj: averaged over the GQA group that shares a v channel), against the inputs
    transformers' own forward gives the same weights' q / o / gate / down projections."""
    path = tmp_path / "llama"
    save_hf_model(path, transformers.LlamaConfig(**BASE), seed=5)
    samples = [torch.randint(0, 256, (n,), generator=torch.Generator().manual_seed(n)) for n in (24, 40)]
    got: list[torch.Tensor] = []

    def record(weight, hessian, stat, spec, expand=lambda s: s):
        got.append(stat.clone())
        return torch.ones_like(stat), 0.0  # s = 1: the model keeps its weights, the next layer its inputs

    monkeypatch.setattr(awq, "search_scales", record)
    awq.awq_layers(load_model(path, torch.device("cpu"), torch.float32).model, samples, GPTQSpec(group_size=32))

    hf = transformers.LlamaForCausalLM.from_pretrained(path, torch_dtype=torch.float32)
    inputs: dict[tuple[int, str], list[torch.Tensor]] = {}
    for i, layer in enumerate(hf.model.layers):
        for name, module in (("q", layer.self_attn.q_proj), ("o", layer.self_attn.o_proj),
                             ("gate", layer.mlp.gate_proj), ("down", layer.mlp.down_proj)):
            module.register_forward_pre_hook(
                lambda m, args, key=(i, name): inputs.setdefault(key, []).append(args[0].reshape(-1, args[0].shape[-1])))
    with torch.no_grad():
        for ids in samples:
            hf(ids[None])
    heads, kv_heads = BASE["num_attention_heads"], BASE["num_key_value_heads"]
    want = []
    for i in range(BASE["num_hidden_layers"]):
        for name in ("q", "o", "gate", "down"):
            mean = torch.cat(inputs[i, name]).abs().mean(dim=0)
            want.append(mean.view(kv_heads, heads // kv_heads, -1).mean(dim=1).reshape(-1) if name == "o" else mean)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w, rtol=1e-4, atol=1e-6)
