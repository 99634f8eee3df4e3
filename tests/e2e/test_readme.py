"""The README's language examples run, in order, as one session (on the shared SmolLM2 engine)."""
from __future__ import annotations

import re
from pathlib import Path

import pytest

import radixlang as rl

pytestmark = pytest.mark.e2e
README = Path(__file__).resolve().parents[2] / "README.md"


class SharedRuntime(rl.EngineBackend):
    """Stands in for `rl.Runtime()`: the session's engine; `shutdown()` leaves it running."""

    def shutdown(self) -> None:
        self.engine.check_invariants()


def test_readme_language_examples_run(smollm_engine, monkeypatch, capsys):
    section = README.read_text().split("## Language", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.S)
    assert len(blocks) >= 5
    monkeypatch.setattr(rl, "Runtime", lambda *a, **k: SharedRuntime(smollm_engine))
    monkeypatch.setattr(rl.global_config, "default_backend", None)
    namespace: dict = {}
    for block in blocks:
        exec(compile(block, str(README), "exec"), namespace)  # noqa: S102 - the README's own code
    out = capsys.readouterr().out
    assert "The capital of France is Paris." in out
    assert "['question']" in out and "text" in out and " end" in out
    assert "TypeError('cannot append int" in out


class SharedEngine:
    """Stands in for `Engine()` in the README: the session's engine, which outlives the example."""

    def __init__(self, engine) -> None:
        self._engine = engine

    def __getattr__(self, name: str):
        return getattr(self._engine, name)

    def __enter__(self) -> "SharedEngine":
        return self

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    def shutdown(self) -> None:
        self._engine.check_invariants()


@pytest.mark.parametrize("section, expected", [
    ("Engine", ["Paris", "length 16"]),
    ("Constrained decoding", ['"name"', "Age: "]),
])
def test_readme_engine_examples_run(smollm_engine, monkeypatch, capsys, section, expected):
    import radixlang.runtime.engine as engine_module

    text = README.read_text().split(f"## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks
    monkeypatch.setattr(engine_module, "Engine", lambda *a, **k: SharedEngine(smollm_engine))
    for block in blocks:
        exec(compile(block, str(README), "exec"), {})  # noqa: S102 - the README's own code
    out = capsys.readouterr().out
    for needle in expected:
        assert needle in out
