"""Weight-only int8: the layer against the matmul it stands for, the quantization error bound, and the
engine in int8 mode against the fp32 engine on the tiny model."""
from __future__ import annotations

import torch
from torch import nn

from radixlang.runtime.models.quant import Int8Linear, quantize_int8


def test_int8_linear_computes_with_its_dequantized_weights():
    g = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(48, 128, generator=g), torch.randn(48, generator=g)
    layer = Int8Linear(weight, bias)
    x = torch.randn(3, 5, 128, generator=g)
    want = x.to(torch.bfloat16).float() @ layer.dequantized().T + bias
    got = layer(x)
    assert got.shape == (3, 5, 48) and got.dtype == torch.float32
    assert torch.allclose(got, want, rtol=2e-2, atol=2e-2)  # bf16 output rounding


def test_quantization_error_is_at_most_half_a_step_per_weight():
    weight = torch.randn(64, 32, generator=torch.Generator().manual_seed(1)) * torch.logspace(-3, 1, 64)[:, None]
    layer = Int8Linear(weight, None)
    step = layer.scale.float()[:, None]
    assert ((layer.dequantized() - weight).abs() <= step / 2 * 1.01 + weight.abs() * 2**-8).all()
    assert layer.qweight.abs().max() <= 127


def test_quantize_replaces_the_linears_and_gives_a_tied_head_its_own_copy():
    model = nn.Module()
    model.embed_tokens = nn.Embedding(10, 64)
    model.proj = nn.Linear(64, 64)
    model.narrow = nn.Linear(40, 64)  # a width the int8 kernel does not take stays fp32
    model.lm_head = None
    quantize_int8(model)
    assert isinstance(model.proj, Int8Linear) and isinstance(model.lm_head, Int8Linear)
    assert type(model.narrow) is nn.Linear and isinstance(model.embed_tokens, nn.Embedding)


def test_int8_engine_scores_close_to_the_fp32_engine(tiny_engine_factory):
    prompts = ["The history of the printing press", "1, 2, 3, 4, 5,"]
    params = {"temperature": 0, "max_new_tokens": 8, "ignore_eos": True}
    fp32 = tiny_engine_factory().generate(prompts, params, return_logprob=True, logprob_start_len=0)
    int8 = tiny_engine_factory(quantization="int8")
    got = int8.generate(prompts, params, return_logprob=True, logprob_start_len=0)
    for a, b in zip(fp32, got):  # the prompt's scores: the same tokens under both weight sets
        for x, y in zip(a.meta.input_logprobs, b.meta.input_logprobs):
            # int8 weights, bf16 activations and bf16 outputs each round at ~0.4% per layer: within 3% of the
            # tiny model's large logprobs (a wrong scale or layout is off by far more)
            assert abs(x.logprob - y.logprob) <= 0.03 * abs(x.logprob) + 0.05, (x.logprob, y.logprob)
    assert any(a.output_ids[:3] == b.output_ids[:3] for a, b in zip(fp32, got))
    int8.check_invariants()
