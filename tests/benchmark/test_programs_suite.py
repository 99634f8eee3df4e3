"""The program benchmark's --quick run completes on the tiny random model and writes well-formed results
(not timed: speed on CI machines means nothing)."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import pytest

from ..conftest import TINY_CONFIG, tiny_weights, write_hf_folder

ROOT = Path(__file__).resolve().parents[2]
RADIXLANG, NO_CACHE, HF = "radixlang", "radixlang, no radix cache", "HF transformers"


def check_row(row: dict) -> None:
    assert row["programs"] == 2
    for key in ("seconds", "programs_per_s", "speedup"):
        assert math.isfinite(row[key]) and row[key] > 0, (row["system"], key)
    assert math.isfinite(row["tokens_per_s"]) and row["tokens_per_s"] >= 0  # a select generates no token
    for key in ("accuracy", "cache_hit_rate"):
        assert row[key] is None or 0.0 <= row[key] <= 1.0, (row["system"], key)
    if row["latency_p50"] is not None:
        assert 0 < row["latency_p50"] <= row["latency_p99"]


@pytest.fixture(scope="module")
def tiny_transformers_dir(tmp_path_factory, tokenizer) -> Path:
    """The tiny random model, with the model_type transformers needs to load it as the HF baseline."""
    cfg = TINY_CONFIG | {"model_type": "llama"}
    return write_hf_folder(tmp_path_factory.mktemp("tiny-hf"), cfg, tiny_weights(cfg), tokenizer)


def test_quick_suite_writes_results(tiny_transformers_dir, tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmark.programs.run import WORKLOADS, main

    document = main(["--quick", "--model", str(tiny_transformers_dir), "--out", str(tmp_path), "--baselines", "hf",
                     "--batch-size", "4", "--kv-cache-tokens", "8192"])

    written = json.loads((tmp_path / "results.json").read_text())
    assert written == json.loads(json.dumps(document))
    assert [w["name"] for w in written["workloads"]] == [w.name for w in WORKLOADS]
    for workload in written["workloads"]:
        rows = workload["results"]
        first = rows[0]
        for row in rows:
            check_row(row)
            assert math.isclose(row["speedup"], first["programs_per_s"] / row["programs_per_s"])
        systems = [r["system"] for r in rows]
        if workload["name"] == "remote program":
            assert len(systems) == 3 and all(s.startswith("radixlang, ") for s in systems)
            continue
        assert systems[0] == RADIXLANG and NO_CACHE in systems and HF in systems
        by_system = {r["system"]: r for r in rows}
        assert by_system[NO_CACHE]["cache_hit_rate"] == 0.0
        assert by_system[HF]["cache_hit_rate"] is None
    by_name = {w["name"]: w for w in written["workloads"]}
    assert by_name["few-shot QA"]["results"][0]["cache_hit_rate"] > 0.5  # the shared 8-shot prefix
    assert "radixlang, no jump-forward" in [r["system"] for r in by_name["JSON extraction"]["results"]]
    for name in ("results.md", "results_relative.md"):
        text = (tmp_path / name).read_text()
        assert all(w.name in text for w in WORKLOADS)
    has_matplotlib = importlib.util.find_spec("matplotlib") is not None
    assert (tmp_path / "results.png").exists() == has_matplotlib
