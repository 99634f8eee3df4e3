"""The engine on the Triton backend (interpreted on a CPU) gives the torch backend's greedy tokens: prefill,
chunked extends, decodes, and cascade decodes over a shared radix prefix."""
from __future__ import annotations

import pytest

from radixlang.kernels.registry import ATTENTION_BACKENDS
from radixlang.runtime.execution import model_runner

pytestmark = pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")

SHARED = "A long shared instruction that every request repeats before its own question. " * 2
GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


def test_triton_engine_matches_torch_engine_with_cascade(tiny_engine_factory, monkeypatch):
    prompts = [SHARED + q for q in ("Why?", "How so?", "Where to?")] + ["unrelated"]
    want = [c.output_ids for c in tiny_engine_factory(attention_backend="torch").generate(prompts, GREEDY)]
    monkeypatch.setattr(model_runner, "CASCADE_MIN_PREFIX", 8)
    engine = tiny_engine_factory(attention_backend="triton", max_prefill_tokens=16)
    groups = []
    real_plan = engine.runner.attn.plan

    def spying_plan(batch):
        groups.append(batch.prefix_groups)
        return real_plan(batch)

    monkeypatch.setattr(engine.runner.attn, "plan", spying_plan)
    engine.generate(SHARED, {**GREEDY, "max_new_tokens": 1})  # the shared prefix enters the radix tree
    got = [c.output_ids for c in engine.generate(prompts, GREEDY)]
    assert got == want
    assert any(len(members) == 3 for step in groups for members, _ in step)  # the three shared a cascade
    engine.check_invariants()
