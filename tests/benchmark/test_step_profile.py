"""benchmark/step_profile.py runs on the tiny model and prints every part of the step (not timed)."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[2] / "benchmark" / "step_profile.py"


def test_prints_each_part_of_the_step_and_the_host_share(tiny_model_dir):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--model", str(tiny_model_dir), "--rows", "2",
                           "--tokens", "4", "--repeats", "1", "--cprofile", "5"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    lines = proc.stdout.splitlines()
    assert lines[0].startswith("2 row(s) x 4 tokens")
    parts = {line.split()[0]: float(line.split()[1]) for line in lines[1:9]}
    assert set(parts) == {"step", "model", "logits", "runner", "plan", "schedule", "process", "sample"}
    assert all(v > 0 for v in parts.values()), parts  # every wrapped part ran inside the timed steps
    assert parts["step"] >= parts["runner"] >= parts["model"] and parts["process"] >= parts["sample"]
    assert "host work in the step" in lines[9] and "Ordered by: internal time" in proc.stdout
