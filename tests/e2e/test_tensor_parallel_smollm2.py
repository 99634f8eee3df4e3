"""SmolLM2-135M (9 query heads, 3 KV heads) at tensor parallelism 3, each rank a gloo process: the same
greedy text as the single-process engine."""
from __future__ import annotations

import pytest

from radixlang.runtime.engine import Engine

pytestmark = pytest.mark.e2e

QUESTIONS = ["What is the capital of France?", "Name three primary colors."]


def test_smollm2_at_tp3_gives_the_greedy_text_of_tp1(smollm_engine):
    prompts = [smollm_engine.tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    params = {"temperature": 0, "max_new_tokens": 24}
    want = [c.text for c in smollm_engine.generate(prompts, params)]
    with Engine(device="cpu", kv_cache_tokens=2048, tp_size=3, quantization="none") as engine:
        got = [c.text for c in engine.generate(prompts, params)]
        engine.check_invariants()
    assert got == want
    assert "Paris" in got[0]
