"""benchmark/step_profile.py runs on the tiny model and prints every part of the step (not timed), on
the eager and the padded CUDA-graph path, with a random model it builds itself, and side by side with a
baseline tree."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmark" / "step_profile.py"
PARTS = {"step", "model", "logits", "sampler", "runner", "plan", "plan_decode", "schedule", "process", "sample",
         "release"}


def run(*args: str) -> list[str]:
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout.splitlines()


@pytest.mark.parametrize("graph", [False, True])
def test_prints_each_part_of_the_step_and_the_host_share(tiny_model_dir, graph):
    lines = run("--model", str(tiny_model_dir), "--rows", "2", "--tokens", "4", "--repeats", "1", "--cprofile", "5",
                *(["--cuda-graph"] if graph else []))
    assert lines[0].startswith(f"2 row(s) x 4 tokens, quantization=none, cuda_graph={graph}")
    parts = {line.split()[0]: float(line.split()[1]) for line in lines[1:1 + len(PARTS)]}
    assert set(parts) == PARTS
    ran = PARTS if graph else PARTS - {"plan_decode"}  # graphs plan decodes on the device, prefills eagerly
    assert all(parts[name] > 0 for name in ran), parts  # every wrapped part ran inside the timed steps
    assert parts["step"] >= parts["runner"] >= parts["model"] and parts["process"] >= parts["sample"] >= parts["sampler"]
    assert "host work in the step" in lines[1 + len(PARTS)]
    assert "Ordered by: internal time" in "\n".join(lines)


def test_random_model_many_rows_against_a_baseline_tree():
    """More rows than the named prompts, a random model built on the fly, this tree as its own baseline."""
    lines = run("--random", "tiny", "--rows", "20", "--tokens", "2", "--repeats", "1", "--rounds", "1",
                "--baseline", str(ROOT), "--clock", "cpu")
    assert lines[0].startswith("20 row(s) x 2 tokens, cuda_graph=False, clock=cpu")
    table = {line.split()[0]: line.split()[1:] for line in lines[2:-1]}
    assert set(table) == PARTS | {"wall", "host"}
    assert float(table["step"][0]) > 0 and float(table["step"][1]) > 0
    assert lines[-1].strip() == "greedy outputs identical: True"
