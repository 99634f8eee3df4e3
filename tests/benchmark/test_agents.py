"""The agent benchmark runs end to end on the tiny random model and reports every config, with the same
scripted workload in each (not timed, and no ratio asserted: at this size the figures follow the timing
of tool waits against steps; tests/runtime/test_retention.py asserts what retention keeps)."""
from __future__ import annotations

import math
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_agents_benchmark_reports_each_config(tiny_model_dir, monkeypatch, capsys):
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmark.agents import CONFIGS, main

    rows = main(["--model", str(tiny_model_dir), "--agents", "2", "--min-turns", "2", "--max-turns", "2",
                 "--max-wait", "0.05", "--background-words", "20"])
    assert [r["config"] for r in rows] == list(CONFIGS)
    assert len({r["agent_turns"] for r in rows}) == 1  # the same scripted workload in every config
    for r in rows:
        assert r["agent_turns"] >= 2 * 2 + 2 * 2  # agent 0 forks 2-3 sub-agents of 2 turns each
        for key in ("ttft_p50_s", "ttft_p99_s", "agent_turns_per_s", "background_tokens_per_s"):
            assert math.isfinite(r[key]) and r[key] >= 0, (r["config"], key)
    for r in rows:
        assert r["recomputed_tokens_per_turn"] >= 0 and r["prefilled_tokens_per_turn"] > 0
    assert "recomputed tokens" in capsys.readouterr().out
