"""Matmul paths follow the CPU: bf16 dense copies only where bf16 units are, else fp32 ones, whose steps of
many rows then compute exactly what quantization="none" computes on the same GGUF."""
from __future__ import annotations

import pytest
import torch

from radixlang.runtime.engine import Engine
from radixlang.runtime.models import cpu_paths, quant
from radixlang.runtime.models.quant import Int4Linear, quantize_int4_rtn

from .test_quant import PROMPTS, tiny_q4_gguf  # noqa: F401 (a fixture)


@pytest.mark.parametrize("capability,flags,dense", [
    ("AVX512", {"avx2", "avx512", "avx512_bf16", "amx_tile"}, torch.bfloat16),  # Sapphire Rapids
    ("AVX512", {"avx2", "avx512"}, torch.float32),  # Skylake / Ice Lake server: no bf16 units
    ("AVX2", {"avx2"}, torch.float32),  # AMD EPYC Zen 2/3
    ("AVX2", {"avx2", "avx512", "avx512_bf16"}, torch.float32),  # torch dispatch capped at AVX2
])
def test_dense_copies_are_bf16_only_on_cpus_with_bf16_units(monkeypatch, capability, flags, dense):
    monkeypatch.delenv("RADIXLANG_CPU_PATHS", raising=False)
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: capability)
    for name in ("avx2", "avx512", "avx512_bf16", "amx_tile"):
        monkeypatch.setattr(torch.cpu, f"_is_{name}_supported", lambda n=name: n in flags)
    cpu_paths.detect.cache_clear()
    try:
        paths = cpu_paths.detect()
        assert paths.dense_dtype == dense and set(paths.flags) == flags
        rows = cpu_paths.BF16_DENSE_MIN_ROWS if dense == torch.bfloat16 else cpu_paths.FP32_DENSE_MIN_ROWS
        assert paths.dense_min_rows == rows and capability in paths.describe()
        monkeypatch.setenv("RADIXLANG_CPU_PATHS", "bf16")
        cpu_paths.detect.cache_clear()
        assert cpu_paths.detect().dense_dtype == torch.bfloat16
        monkeypatch.setenv("RADIXLANG_CPU_PATHS", "fast")
        cpu_paths.detect.cache_clear()
        with pytest.raises(ValueError, match="RADIXLANG_CPU_PATHS"):
            cpu_paths.detect()
    finally:
        cpu_paths.detect.cache_clear()


def test_the_fp32_dense_path_is_the_fp32_matmul_of_the_stored_weights(monkeypatch):
    monkeypatch.setattr(quant, "DENSE_DTYPE", torch.float32)
    w = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    blocks = quantize_int4_rtn(w)
    linear = Int4Linear(blocks, None)
    x = torch.randn(quant.DENSE_MIN_ROWS, 128, generator=torch.Generator().manual_seed(1))
    assert linear.dense.dtype == torch.float32
    assert torch.equal(linear(x), x @ blocks.dequantize().T)  # no bf16 rounding of inputs or weights


def test_auto_on_an_fp32_path_cpu_scores_prompts_as_none(tiny_q4_gguf, monkeypatch):  # noqa: F811
    # prompt chunks run the dense fp32 copies (the file's own weights, dequantized): none's computation
    monkeypatch.setattr(quant, "DENSE_DTYPE", torch.float32)
    monkeypatch.setattr(quant, "DENSE_MIN_ROWS", 2)
    prompts = [p for p in PROMPTS if len(p) >= 8]
    scores = {}
    for mode in ("none", "auto"):
        with Engine(str(tiny_q4_gguf), device="cpu", kv_cache_tokens=512, quantization=mode) as engine:
            out = engine.generate(prompts, {"max_new_tokens": 0}, return_logprob=True, logprob_start_len=0)
            scores[mode] = [lp.logprob for o in out for lp in o.meta.input_logprobs if lp.logprob is not None]
            engine.check_invariants()
    assert scores["auto"] == pytest.approx(scores["none"], rel=1e-5, abs=1e-5)
