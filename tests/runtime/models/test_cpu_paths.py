"""Matmul paths follow the CPU: bf16 dense copies only where bf16 units are, else fp32 ones, whose steps of
many rows then compute exactly what quantization="none" computes on the same GGUF; the rows from which a
layer switches are measured once per machine (per form: 4-bit, Q8_0's two halves) and cached on disk."""
from __future__ import annotations

import json

import gguf
import pytest
import torch

from radixlang.kernels.cpu.gguf_blocks import read_blocks
from radixlang.runtime.engine import Engine
from radixlang.runtime.models.linear import cpu_paths, quant
from radixlang.runtime.models.linear.quant import Int4Linear, quantize_int4_rtn

from .test_quant import PROMPTS, file_tensor, tiny_q4_gguf  # noqa: F401 (a fixture)


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
    x = torch.randn(linear.dense_min_rows, 128, generator=torch.Generator().manual_seed(1))
    assert linear.dense.dtype == torch.float32
    assert torch.equal(linear(x), x @ blocks.dequantize().T)  # no bf16 rounding of inputs or weights


def test_auto_on_an_fp32_path_cpu_scores_prompts_as_none(tiny_q4_gguf, monkeypatch):  # noqa: F811
    # without the block kernel (torch's int4pack fallback; with it, BlockLinear runs the kernel at every row count),
    # prompt chunks run the dense fp32 copies (the file's own weights, dequantized): none's computation
    monkeypatch.setenv("RADIXLANG_BLOCK_KERNEL", "0")
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


def lines(packed: tuple[float, float], dense: tuple[float, float], rows=cpu_paths.MEASURED_ROWS,
          one_row: tuple[float, float] | None = None) -> dict[int, tuple[float, float]]:
    """Times growing as intercept + slope * rows for each path (and the one-row times, a path of its own)."""
    times = {r: (packed[0] + packed[1] * r, dense[0] + dense[1] * r) for r in rows}
    return times | ({1: one_row} if one_row else {})


@pytest.mark.parametrize("times,rows", [
    (lines((0.0, 1.0), (9.0, 0.25)), 12),  # the lines cross at 12 rows
    (lines((0.0, 1.0), (9.1, 0.25)), 13),  # between two counts: rounded up
    (lines((0.0, 1.0), (9.0, 0.25)) | {8: (5.0, 11.0), 16: (16.0, 10.0)}, 13),  # two disturbed counts move it by 1
    (lines((0.0, 1.0), (3.0, 0.5), one_row=(1.0, 0.5)), 6),  # a faster dense matrix-vector product alone: ignored
    (lines((1.0, 0.5), (9.0, 0.5)), 64),  # parallel lines, packed below: it never loses
    (lines((0.0, 2.0), (200.0, 0.1)), 64),  # crossing past the counts measured: twice the largest
    (lines((5.0, 2.0), (1.0, 0.5)), 1),  # dense faster at every count
    ({}, 8),  # nothing measured: the features' default
])
def test_crossover_is_where_the_fitted_lines_of_the_two_paths_cross(times, rows):
    assert cpu_paths.crossover(times, default=8) == rows


@pytest.fixture
def fresh_chooser(tmp_path, monkeypatch):
    """The crossover chooser over an empty cache folder and a fake measurement that counts its calls."""
    monkeypatch.setenv("RADIXLANG_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("RADIXLANG_CPU_PATHS", raising=False)
    calls = []

    def fake_measure(dense_dtype, halves):
        calls.append(halves)  # the lines cross at 16 rows for 4-bit layers, at 6 for Q8_0's two halves
        return lines((0.0, 1.0), (12.0, 0.25)) if halves == 1 else lines((0.0, 2.0), (9.0, 0.5))
    monkeypatch.setattr(cpu_paths, "measure", fake_measure)
    cpu_paths.detect.cache_clear()
    cpu_paths._crossovers.cache_clear()
    yield tmp_path, calls
    cpu_paths.detect.cache_clear()
    cpu_paths._crossovers.cache_clear()


def test_crossovers_are_measured_once_per_machine_and_read_from_the_cache_after(fresh_chooser):
    tmp_path, calls = fresh_chooser
    assert (cpu_paths.dense_min_rows(1), cpu_paths.dense_min_rows(2)) == (16, 6)
    assert sorted(calls) == [1, 2]
    saved = json.loads((tmp_path / cpu_paths.CACHE_FILE).read_text())
    key = cpu_paths.detect().cache_key()
    assert (saved[key]["1"], saved[key]["2"]) == (16, 6) and torch.__version__ in key
    cpu_paths._crossovers.cache_clear()  # the next process: reads the file, measures nothing
    assert (cpu_paths.dense_min_rows(1), cpu_paths.dense_min_rows(2)) == (16, 6) and len(calls) == 2
    saved[key]["1"] = 3  # what is read is what decides
    (tmp_path / cpu_paths.CACHE_FILE).write_text(json.dumps(saved))
    cpu_paths._crossovers.cache_clear()
    assert cpu_paths.dense_min_rows(1) == 3 and len(calls) == 2


def test_another_cpu_or_torch_measures_again_and_a_broken_cache_file_is_remeasured(fresh_chooser, monkeypatch):
    tmp_path, calls = fresh_chooser
    (tmp_path / cpu_paths.CACHE_FILE).write_text(json.dumps({"AVX512|avx2,avx512|bf16|torch0|2t": {"1": 3, "2": 3}}))
    assert cpu_paths.dense_min_rows(1) == 16 and len(calls) == 2
    saved = json.loads((tmp_path / cpu_paths.CACHE_FILE).read_text())
    assert len(saved) == 2  # the other machine's entry is kept
    (tmp_path / cpu_paths.CACHE_FILE).write_text("{not json")
    cpu_paths._crossovers.cache_clear()
    assert cpu_paths.dense_min_rows(2) == 6 and len(calls) == 4


def test_forced_paths_take_the_features_defaults_without_measuring(fresh_chooser, monkeypatch):
    _, calls = fresh_chooser
    monkeypatch.setenv("RADIXLANG_CPU_PATHS", "fp32")
    cpu_paths.detect.cache_clear()
    assert cpu_paths.dense_min_rows(1) == cpu_paths.dense_min_rows(2) == cpu_paths.FP32_DENSE_MIN_ROWS
    assert calls == []


def test_a_q8_0_layer_runs_the_packed_kernel_below_its_own_crossover_and_the_dense_copy_from_it(fresh_chooser):
    # Q8_0 runs as two int4 halves over a repeated input; its crossover is measured for that form (the old
    # rule switched at rows x halves >= 8, so at 4 rows this layer ran the dense copy)
    raw, weight = file_tensor(gguf.GGMLQuantizationType.Q8_0, 48, 128, seed=3)
    layer = Int4Linear(read_blocks(raw, gguf.GGMLQuantizationType.Q8_0, (48, 128)), None)
    four_bit = Int4Linear(quantize_int4_rtn(weight), None)
    assert (layer.repeats, layer.dense_min_rows, four_bit.dense_min_rows) == (2, 6, 16)
    x = torch.randn(6, 128, generator=torch.Generator().manual_seed(4))

    def packed(rows: torch.Tensor) -> torch.Tensor:  # the int4pack kernel on the repeated bf16 input
        return torch.ops.aten._weight_int4pack_mm_for_cpu(rows.to(torch.bfloat16).repeat(1, 2), layer.packed, 32,
                                                          layer.scales_zeros).float()
    assert torch.equal(layer(x[:4]), packed(x[:4]))
    assert torch.equal(layer(x), (x.to(layer.dense.dtype) @ layer.dense.T).float())
    assert torch.equal(layer.dense.float(), weight.to(layer.dense.dtype).float())  # the file's weights
