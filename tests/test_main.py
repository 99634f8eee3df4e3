"""`python -m radixlang` is the `radixlang` console script."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

SCRIPT = Path(sys.executable).parent / "radixlang"  # installed by pyproject's [project.scripts]


def run(command: list[str]) -> subprocess.CompletedProcess:
    return subprocess.run(command, capture_output=True, text=True, timeout=120)


def test_python_dash_m_radixlang_prints_the_console_scripts_help():
    module, script = run([sys.executable, "-m", "radixlang", "--help"]), run([str(SCRIPT), "--help"])
    assert module.returncode == script.returncode == 0, module.stderr
    assert module.stdout.startswith("usage: radixlang ") and "{generate,serve,quantize,cache}" in module.stdout
    assert module.stdout == script.stdout


def test_python_dash_m_radixlang_rejects_an_unknown_command_like_the_script():
    module, script = run([sys.executable, "-m", "radixlang", "fly"]), run([str(SCRIPT), "fly"])
    assert module.returncode == script.returncode == 2
    assert "invalid choice: 'fly'" in module.stderr and module.stderr == script.stderr
