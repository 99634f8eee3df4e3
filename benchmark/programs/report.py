"""Results out: a JSON document, markdown tables (absolute, or ratios only for the README), a bar chart.

In every workload the first system is the one measured against the rest (radixlang with its radix cache;
the remote program for the HTTP workload); "speed-up" is its programs/s over the row's.
"""
from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from .measure import Measurement, Workload


def workload_result(workload: Workload, measurements: list[Measurement]) -> dict[str, Any]:
    first = measurements[0]
    rows = [dataclasses.asdict(m) | {"speedup": first.programs_per_s / m.programs_per_s} for m in measurements]
    return {"name": workload.name, "description": workload.description, "items": first.programs, "results": rows}


def _fmt(value: float | None, pattern: str) -> str:
    return "–" if value is None else format(value, pattern)


def _ratio(value: float | None, reference: float | None) -> str:
    return "–" if value is None or not reference else f"{value / reference:.2f}x"


def workload_table(result: dict[str, Any], relative: bool) -> str:
    """Absolute: throughput, latency in seconds. Relative: each row's throughput and latency divided by
    the first row's, so a noisy machine's absolute speed drops out."""
    rows, first = result["results"], result["results"][0]
    if relative:
        head = "| system | throughput vs first | p50 latency vs first | p99 latency vs first | cache hit | accuracy |"
    else:
        head = "| system | programs/s | gen tok/s | p50 / p99 latency (s) | cache hit | accuracy | speed-up of first |"
    lines = [f"**{result['name']}** ({result['items']} programs: {result['description']})", "", head,
             "|" + " --- |" * head.count(" | ") + " --- |"]
    for r in rows:
        common = f"{_fmt(r['cache_hit_rate'], '.0%')} | {_fmt(r['accuracy'], '.0%')} |"
        if relative:
            lines.append(f"| {r['system']} | {_ratio(r['programs_per_s'], first['programs_per_s'])} | "
                         f"{_ratio(r['latency_p50'], first['latency_p50'])} | "
                         f"{_ratio(r['latency_p99'], first['latency_p99'])} | {common}")
        else:
            lines.append(f"| {r['system']} | {r['programs_per_s']:.2f} | {r['tokens_per_s']:.1f} | "
                         f"{_fmt(r['latency_p50'], '.3f')} / {_fmt(r['latency_p99'], '.3f')} | {common} "
                         f"{r['speedup']:.2f}x |")
    return "\n".join(lines)


def speedup_table(results: list[dict[str, Any]]) -> str:
    """One row per workload: the first system's speed-up over every other system measured."""
    others: list[str] = []
    for result in results:
        others += [r["system"] for r in result["results"][1:] if r["system"] not in others]
    lines = ["| workload | first system | " + " | ".join(f"vs {o}" for o in others) + " |",
             "| --- | --- |" + " --- |" * len(others)]
    for result in results:
        speedups = {r["system"]: r["speedup"] for r in result["results"][1:]}
        cells = [f"{speedups[o]:.2f}x" if o in speedups else "–" for o in others]
        lines.append(f"| {result['name']} | {result['results'][0]['system']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def markdown(results: list[dict[str, Any]], relative: bool) -> str:
    parts = ["Speed-up of the first system (programs/s ratio):", "", speedup_table(results)]
    for result in results:
        parts += ["", workload_table(result, relative)]
    return "\n".join(parts) + "\n"


def plot(results: list[dict[str, Any]], path: Path) -> str | None:
    """A grouped bar chart of each workload's speed-ups; returns why it was skipped, or None."""
    try:
        import matplotlib
    except ImportError:
        return "matplotlib is not installed (pip install -e '.[bench]'); no chart"
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FuncFormatter

    colors: dict[str, str] = {}
    fig, ax = plt.subplots(figsize=(10, 4.2), dpi=90)
    for i, result in enumerate(results):  # each workload's bars centred on its tick, one colour per system
        rows = result["results"][1:]
        width = 0.8 / max(len(rows), 1)
        for k, row in enumerate(rows):
            new = row["system"] not in colors
            colors.setdefault(row["system"], f"C{len(colors)}")
            ax.bar(i + (k - (len(rows) - 1) / 2) * width, row["speedup"], width, color=colors[row["system"]],
                   label=f"vs {row['system']}" if new else None)
    ax.axhline(1.0, color="black", linewidth=0.8)
    ax.set_yscale("log")
    for axis_format in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):
        axis_format(FuncFormatter(lambda value, _: f"{value:g}x"))
    ax.set_xticks(range(len(results)), [r["name"] for r in results], rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("speed-up (programs/s ratio, log scale)")
    ax.set_title("radixlang over each baseline, measured in the same run (remote program: over per-call HTTP)")
    ax.legend(fontsize=7, ncol=2)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
    return None
