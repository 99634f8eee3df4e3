"""The example scripts run end to end (on the shared SmolLM2 engine instead of starting their own)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

import radixlang as rl

pytestmark = pytest.mark.e2e
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


class SharedRuntime(rl.EngineBackend):
    """Stands in for `rl.Runtime()`: the session's engine, left running on exit."""

    def __enter__(self) -> "SharedRuntime":
        return self

    def __exit__(self, *exc: object) -> None:
        self.engine.check_invariants()


def run_example(name: str, smollm_engine, monkeypatch, capsys) -> str:
    monkeypatch.setattr(rl, "Runtime", lambda *a, **k: SharedRuntime(smollm_engine))
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main()
    return capsys.readouterr().out


def test_quickstart(smollm_engine, monkeypatch, capsys):
    out = run_example("quickstart", smollm_engine, monkeypatch, capsys)
    assert "answer:  The capital of France is Paris." in out and "IR params: ['question']" in out


def test_few_shot_batch(smollm_engine, monkeypatch, capsys):
    out = run_example("few_shot_batch", smollm_engine, monkeypatch, capsys)
    assert "-> Madrid" in out and "-> Tokyo" in out and "6 programs in" in out


def test_tree_of_thought(smollm_engine, monkeypatch, capsys):
    out = run_example("tree_of_thought", smollm_engine, monkeypatch, capsys)
    assert "Ideas I considered:\n1. " in out and "The most practical idea is number " in out


def test_react_agent(smollm_engine, monkeypatch, capsys):
    out = run_example("react_agent", smollm_engine, monkeypatch, capsys)
    assert "Action: lookup[mount everest]\nObservation: Mount Everest is 8849 metres tall." in out


def test_json_extraction(smollm_engine, monkeypatch, capsys):
    out = run_example("json_extraction", smollm_engine, monkeypatch, capsys)
    people = [json.loads(line.split(" <- ")[0]) for line in out.splitlines() if " <- " in line]
    assert [p["name"] for p in people] == ["Maria Lopez", "Kenji Watanabe", "Amara Okafor"]
    assert [p["age"] for p in people] == [34, 58, 21]


def test_tool_agent(smollm_engine, monkeypatch, capsys):
    out = run_example("tool_agent", smollm_engine, monkeypatch, capsys)
    calls = [line for line in out.splitlines() if line.startswith("call: ")]
    assert calls and all(c.startswith(("call: get_temperature({'city': ", "call: celsius_to_fahrenheit({'celsius': "))
                         for c in calls)
    assert "answer: " in out
