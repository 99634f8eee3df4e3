"""Benchmark results are data: saved with their machine, rendered into the docs, and the docs never stale."""
from __future__ import annotations

import json

from radixlang.benchmark import results


def cpu_decode_result() -> dict:
    cells = {"batch 1": (2.0, 128), "few-shot": (4.0, 256)}  # (seconds, tokens)
    peer = {"batch 1": (4.0, 128), "few-shot": (5.0, 256)}
    systems = {name: {w: {"seconds": s, "tokens": t, "tok_s": t / s} for w, (s, t) in c.items()}
               for name, c in {"radixlang auto": cells, "llama.cpp": peer}.items()}
    return {"benchmark": "cpu_decode", "date": "2026-12-05 03:00 UTC", "command": "cpu_decode.py --publish",
            "machine": {"cpu": "Test CPU", "cores": 2, "cpu_flags": ["avx512_vnni"], "torch": "2.13.0", "commit": "abc"},
            "figures": {"workloads": ["batch 1", "few-shot"], "systems": systems}}


def test_the_cpu_decode_table_shows_each_figure_and_the_same_run_ratio():
    table = results.render_cpu_decode(cpu_decode_result())
    assert "| radixlang auto | 64.0 tok/s | 4.00 s |" in table
    assert "| llama.cpp | 32.0 tok/s | 5.00 s |" in table
    # ratios of throughput in the same run: 64/32 at batch 1, (256/4)/(256/5) few-shot
    assert "| radixlang auto / llama.cpp | **2.00x** | **1.25x** |" in table
    assert "Test CPU, 2 cores (avx512_vnni)" in table and "commit abc" in table


def test_fill_replaces_only_the_marked_body_and_says_when_nothing_is_published():
    text = "a\n<!-- results:cpu_decode -->\nold\n<!-- /results:cpu_decode -->\nb\n<!-- results:x -->\n<!-- /results:x -->"
    out = results.fill(text, {"cpu_decode": "NEW"})
    assert out.startswith("a\n<!-- results:cpu_decode -->\nNEW\n<!-- /results:cpu_decode -->\nb\n")
    assert "no published result for `x`" in out
    assert results.fill(out, {"cpu_decode": "NEW"}) == out  # idempotent


def test_save_records_the_machine_and_publishes_on_request(tmp_path, monkeypatch):
    monkeypatch.setattr(results, "LOCAL_DIR", tmp_path / "local")
    monkeypatch.setattr(results, "PUBLISHED_DIR", tmp_path / "published")
    local = results.save("demo", {"x": 1.5}, command="demo.py")
    saved = json.loads(local.read_text())
    assert saved["figures"] == {"x": 1.5} and saved["command"] == "demo.py"
    assert saved["machine"]["cores"] >= 1 and "cpu_flags" in saved["machine"]
    assert not (tmp_path / "published").exists()
    results.save("demo", {"x": 2.0}, publish=True)
    assert json.loads((tmp_path / "published" / "demo.json").read_text())["figures"] == {"x": 2.0}


def test_the_docs_show_the_latest_published_results():
    """README.md's and docs/performance.md's tables are what `make results` renders from docs/results/."""
    tables = results.render_all(results.published())
    for path in results.RENDERED:
        if path.exists():
            text = path.read_text()
            assert results.fill(text, tables) == text, f"{path.name} is stale: run `make results`"
