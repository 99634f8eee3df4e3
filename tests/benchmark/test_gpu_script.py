"""benchmark/gpu.py --quick: the whole script runs on a CPU (torch, and Triton in its interpreter) on a tiny
transformers-saved model and prints one JSON table with every part the GPU run reports."""
from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from transformers import LlamaConfig

from radixlang.kernels.registry import ATTENTION_BACKENDS

from ..runtime.models.hf_tiny import BASE, save_hf_model

pytestmark = pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")
SCRIPT = Path(__file__).resolve().parents[2] / "benchmark" / "gpu.py"


def test_quick_mode_prints_the_full_json_table(tmp_path):
    model = tmp_path / "model"
    save_hf_model(model, LlamaConfig(**BASE))
    out = tmp_path / "table.json"
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, str(SCRIPT), "--quick", "--model", str(model), "--out", str(out)],
                          env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = json.loads(out.read_text())
    assert json.loads(proc.stdout[proc.stdout.index("{"):]) == table  # what it printed is what it wrote
    assert not [k for k, v in table.items() if isinstance(v, dict) and "error" in v]  # every part ran
    assert "graph_capture_error" not in table
    assert [r["batch"] for r in table["throughput"]] == [1, 3]
    for row in table["throughput"]:
        assert row["radixlang_tok_s"] > 0 and row["hf_tok_s"] > 0
        assert row["ratio"] == pytest.approx(row["radixlang_tok_s"] / row["hf_tok_s"])
    shared = table["shared_prefix"]
    assert set(shared["seconds"]) == {"cascade", "no_cascade", "no_cascade_no_graphs"}
    assert shared["cascade_graph_steps"] > 0  # the cascade run's decodes went through the graphs' cascade variant
    # the padded forward, run eagerly on the CPU, stands in for a replay
    assert set(shared["device_decode_step_ms"]) == {"cascade", "no_cascade"}
    assert all(ms > 0 for ms in shared["device_decode_step_ms"].values()) and shared["device_cascade_speedup"] > 0
    hbm = table["decode_hbm"]
    assert hbm["bytes_per_step"] > hbm["weight_bytes"] > 0
    assert hbm["device_step_ms"] > 0 and hbm["device_tb_s"] > 0 and hbm["device_fraction_of_peak"] is None
    correctness = table["correctness"]
    # fp32 on a CPU: the padded path, Triton and the torch reference all give the same greedy tokens
    assert correctness["graphs_on_vs_off_float32"]["fraction"] == 1.0
    assert correctness["greedy_fp32_triton_vs_torch"]["fraction"] == 1.0
    assert correctness["top1_logprob_triton_vs_torch"]["dtype"] == "float32"
    assert correctness["top1_logprob_triton_vs_torch"]["ok"] and correctness["greedy_fp32_triton_vs_torch"]["ok"]
    kernels = table["kernels"]
    assert {(r["requests"], r["context"]) for r in kernels["decode"]} == {(1, 40), (2, 40)}
    for part, oracle in (("mla_decode", "sdpa_ms"), ("fused_moe", "grouped_ms")):  # each against its torch form
        assert len(kernels[part]) == 1 and isinstance(kernels[part][0][oracle], float)
        assert kernels[part][0]["max_abs_diff"] < 1e-4
    dequant = kernels["dequant_gemm"]  # the GPTQ / AWQ kernel against a matmul on its dequantized weights
    assert [r["rows"] for r in dequant] == [3, 20] and all(r["max_rel_diff"] < 1e-5 for r in dequant)
    w8a8 = kernels["w8a8"]  # the W8A8 linear against a dense matmul, and checked against the CPU's formulas
    assert [r["rows"] for r in w8a8] == [3, 20] and all(isinstance(r["dense_ms"], float) for r in w8a8)
    assert all(r["codes_bit_equal"] and r["int32_exact"] and r["max_rel_diff"] < 1e-5 for r in w8a8)
    assert all(isinstance(r[k], float) for r in kernels["decode"] + kernels["extend"]
               for k in ("triton_ms", "sdpa_ms", "reference_ms"))
    assert set(table["goals"]) == {"batch1_vs_hf>=20", "batch256_vs_hf>=5", "cascade_vs_no_cascade>=3",
                                   "decode_hbm>=60%", "graphs_on_equals_off"}
    assert table["graph_buckets"] == [1, 2, 3] and table["graphs_captured"] is False


def load_script():
    spec = importlib.util.spec_from_file_location("gpu_benchmark", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_a_failing_part_is_recorded_and_the_rest_still_written(tmp_path):
    gpu = load_script()
    out = tmp_path / "table.json"
    report = gpu.Report(out, {"device": "x"})
    report.part("throughput", lambda: [{"batch": 1, "ratio": 25.0}, {"batch": 256, "ratio": 4.0}])
    report.part("shared_prefix", lambda: 1 / 0)
    report.part("correctness", lambda: {"graphs_on_vs_off_float32": {"fraction": 1.0}})
    table = json.loads(out.read_text())
    assert table["shared_prefix"] == {"error": "ZeroDivisionError: division by zero"}
    assert gpu.goals(table) == {"batch1_vs_hf>=20": True, "batch256_vs_hf>=5": False,
                                "cascade_vs_no_cascade>=3": False, "decode_hbm>=60%": False,
                                "graphs_on_equals_off": True}
