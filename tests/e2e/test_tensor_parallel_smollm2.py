"""SmolLM2-135M (9 query heads, 3 KV heads) at tensor parallelism 3, each rank a gloo process: the same
tokens and logprobs as the single-process engine, bit for bit, in the exact mode and in the default one (the GGUF's
blocks)."""
from __future__ import annotations

import pytest

from radixlang.runtime.engine import Engine

pytestmark = pytest.mark.e2e

QUESTIONS = ["What is the capital of France?", "Name three primary colors."]


def test_smollm2_at_tp3_gives_tp1s_tokens_and_logprobs_bit_for_bit_in_the_exact_mode(smollm_engine):
    """dense_mm linears, the o / down projections gathered on the CPU's ranks (the K-split all-reduce gave the same
    tokens, not the same bits)."""
    prompts = [smollm_engine.tokenizer.apply_chat_template([{"role": "user", "content": q}]) for q in QUESTIONS]
    want = greedy_with_logprobs(smollm_engine, prompts)
    with Engine(device="cpu", kv_cache_tokens=2048, tp_size=3, quantization="none") as engine:
        got = greedy_with_logprobs(engine, prompts)
        engine.check_invariants()
    assert got == want
    assert "Paris" in got[0][0]


def greedy_with_logprobs(engine: Engine, prompts: list[str]) -> list[tuple[str, list[int], list[float]]]:
    outs = engine.generate(prompts, {"temperature": 0, "max_new_tokens": 16}, return_logprob=True)
    return [(o.text, o.output_ids, [lp.logprob for lp in o.meta.output_logprobs]) for o in outs]


def test_smollm2_default_mode_at_tp3_gives_tp1s_tokens_and_logprobs_bit_for_bit():
    """Issue 43: `generate "The capital of France is" --tp 3` in the default mode said "The answer is: 2018-01"
    where TP 1 says "The United States has a population..." (TP ran the fp32 path). The second run of the batch
    takes its prompts from the radix cache."""
    prompts = ["The capital of France is"]
    with Engine(device="cpu", kv_cache_tokens=2048, compile_layers=False) as engine:
        prompts.append(engine.tokenizer.apply_chat_template([{"role": "user", "content": QUESTIONS[1]}]))
        want = greedy_with_logprobs(engine, prompts)
        engine.check_invariants()
    with Engine(device="cpu", kv_cache_tokens=2048, tp_size=3) as engine:
        assert engine.config.load_quantization() == "auto"
        got = [greedy_with_logprobs(engine, prompts) for _ in range(2)]
        engine.check_invariants()
    assert got[0] == want and got[1] == want
    assert "United States" in want[0][0]
