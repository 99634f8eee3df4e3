"""Benchmark results as data: a script saves its figures beside the facts of the machine that produced them,
and the docs render tables from the latest published results instead of copying figures into prose.

- `save(name, figures)` writes `benchmark/results/<name>-<UTC time>.json` (a local log, not tracked) and,
  with `publish=True` (the scripts' `--publish`), `docs/results/<name>.json`: the figures the docs show.
- `python -m radixlang.benchmark.results` re-renders the marked tables of README.md and docs/performance.md
  from docs/results/ (`make results`); tests/benchmark/test_results.py fails when they are stale.

A result records where it came from (CPU model and the flags that pick kernels, cores, torch, the commit,
the date), so a figure is never read without its machine.
"""
from __future__ import annotations

import datetime
import json
import os
import platform
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
LOCAL_DIR = ROOT / "benchmark" / "results"
PUBLISHED_DIR = ROOT / "docs" / "results"
RENDERED = (ROOT / "README.md", ROOT / "docs" / "performance.md")
# the CPU features that choose radixlang's kernels and llama.cpp's (AMX tiles, BF16 dot products, VNNI)
KERNEL_FLAGS = ("avx2", "fma", "avx512f", "avx512bw", "avx512_vnni", "avx512_bf16", "amx_tile", "amx_int8")


def machine() -> dict[str, Any]:
    """The facts a reader needs to compare a figure with one of their own."""
    cpu, flags = platform.processor(), set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
            elif line.startswith("flags"):
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    facts: dict[str, Any] = {"cpu": cpu, "cpu_flags": [f for f in KERNEL_FLAGS if f in flags],
                             "cores": os.cpu_count(), "python": platform.python_version(),
                             "os": f"{platform.system()} {platform.release()}"}
    try:
        import torch
        facts["torch"] = torch.__version__
        facts["torch_threads"] = torch.get_num_threads()
        if torch.cuda.is_available():
            facts["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    facts["commit"] = _git("rev-parse", "--short", "HEAD")
    facts["dirty"] = bool(_git("status", "--porcelain", "--untracked-files=no"))
    return facts


def _git(*args: str) -> str:
    try:
        return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


def save(name: str, figures: dict[str, Any], *, publish: bool = False, command: str | None = None) -> Path:
    """Writes one result; returns the local file's path (and publishes it as the docs' latest if asked)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    result = {"benchmark": name, "date": now.strftime("%Y-%m-%d %H:%M UTC"),
              "command": command if command is not None else " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]),
              "machine": machine(), "figures": figures}
    text = json.dumps(result, indent=1) + "\n"
    LOCAL_DIR.mkdir(parents=True, exist_ok=True)
    local = LOCAL_DIR / f"{name}-{now.strftime('%Y%m%dT%H%M%S')}.json"
    local.write_text(text)
    if publish:
        PUBLISHED_DIR.mkdir(parents=True, exist_ok=True)
        (PUBLISHED_DIR / f"{name}.json").write_text(text)
    return local


def published() -> dict[str, dict[str, Any]]:
    return {p.stem: json.loads(p.read_text()) for p in sorted(PUBLISHED_DIR.glob("*.json"))}


def machine_line(result: dict[str, Any]) -> str:
    m = result["machine"]
    flags = ", ".join(m.get("cpu_flags") or []) or "none of the kernel flags"
    return (f"{result['date']}, commit {m.get('commit') or '?'}: {m.get('cpu') or 'unknown CPU'}, {m.get('cores')} cores "
            f"({flags}), torch {m.get('torch', '?')}; `{result['command']}`")


def render_cpu_decode(result: dict[str, Any]) -> str:
    """System x workload, then each radixlang mode's ratio against each peer measured in the same run."""
    figures = result["figures"]
    workloads: list[str] = figures["workloads"]
    systems: dict[str, dict[str, dict[str, float]]] = figures["systems"]
    rows = ["| system | " + " | ".join(workloads) + " |", "| --- |" + " --- |" * len(workloads)]
    for name, cells in systems.items():
        shown = [f"{cells[w]['seconds']:.2f} s" if w == "few-shot" else f"{cells[w]['tok_s']:.1f} tok/s"
                 for w in workloads]
        rows.append(f"| {name} | " + " | ".join(shown) + " |")
    peers = [p for p in ("llama.cpp", "transformers") if p in systems]
    for peer in peers:
        for name in (n for n in systems if n.startswith("radixlang")):
            ratios = [systems[name][w]["tok_s"] / systems[peer][w]["tok_s"] for w in workloads]
            rows.append(f"| {name} / {peer} | " + " | ".join(f"**{r:.2f}x**" for r in ratios) + " |")
    return "\n".join(rows) + f"\n\n<sub>{machine_line(result)}</sub>"


RENDERERS = {"cpu_decode": render_cpu_decode}


def render_all(results: dict[str, dict[str, Any]]) -> dict[str, str]:
    return {name: RENDERERS[name](result) for name, result in results.items() if name in RENDERERS}


def fill(text: str, tables: dict[str, str]) -> str:
    """Replaces the body between `<!-- results:NAME -->` and `<!-- /results:NAME -->` with NAME's table."""
    def body(match: re.Match[str]) -> str:
        name = match.group(1)
        table = tables.get(name, f"(no published result for `{name}` yet: run its benchmark with --publish)")
        return f"<!-- results:{name} -->\n{table}\n<!-- /results:{name} -->"
    return re.sub(r"<!-- results:([\w-]+) -->.*?<!-- /results:\1 -->", body, text, flags=re.S)


def main() -> None:
    tables = render_all(published())
    for path in RENDERED:
        if path.exists():
            text = path.read_text()
            new = fill(text, tables)
            if new != text:
                path.write_text(new)
                print(f"rendered {path.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
