"""examples/multimodal_agent.py runs on the random-weight LLaVA it builds, says its text is meaningless,
and encodes each photo once however many calls look at it."""
from __future__ import annotations

import importlib.util
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[3] / "examples" / "multimodal_agent.py"


def test_multimodal_agent_runs_on_a_random_checkpoint_and_says_so(capsys):
    spec = importlib.util.spec_from_file_location("multimodal_agent", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main([])
    out = capsys.readouterr().out
    assert "the text below is meaningless" in out
    assert "2 photos, 10 calls on them: 2 vision-tower encodes" in out
    assert out.count("tool = ") == 2 and out.count(" -> ") == 6
