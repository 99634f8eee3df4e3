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


def test_agents_benchmark_rounds_pool_every_turn(tiny_model_dir, monkeypatch, capsys):
    """--rounds: each round runs every config on its own seed (the same in each config), and the pooled row of
    a config holds every turn of its rounds, its p99 the slowest of them (fewer than 100 turns: nearest rank)."""
    monkeypatch.syspath_prepend(str(ROOT))
    from benchmark.agents import main

    rows = main(["--model", str(tiny_model_dir), "--agents", "2", "--min-turns", "2", "--max-turns", "3",
                 "--max-wait", "0.05", "--background-words", "20", "--rounds", "2", "--configs", "off,pins+host"])
    assert [(r["round"], r["config"]) for r in rows] == [
        (0, "off"), (0, "pins+host"), (1, "off"), (1, "pins+host"), ("pooled", "off"), ("pooled", "pins+host")]
    assert [r["seed"] for r in rows[:4]] == [0, 0, 1, 1]
    for rnd in (0, 1):
        assert len({r["agent_turns"] for r in rows if r["round"] == rnd}) == 1  # one workload per round
    for config in ("off", "pins+host"):
        rounds = [r for r in rows if r["config"] == config and r["round"] != "pooled"]
        pool = next(r for r in rows if r["config"] == config and r["round"] == "pooled")
        assert pool["agent_turns"] == sum(r["agent_turns"] for r in rounds)
        assert pool["ttft_p99_s"] == max(r["ttft_p99_s"] for r in rounds)
        assert pool["ttft_p50_s"] <= pool["ttft_p95_s"] <= pool["ttft_p99_s"]
    out = capsys.readouterr().out
    assert "pooled over 2 rounds" in out and "lower p95" in out
