"""Speculative decoding with the real SmolLM2: greedy output equals plain decoding's on the 20 reference
prompts and on extractive prompts (where n-gram drafts are accepted often)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.e2e

REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "hf_greedy_smollm2.json").read_text())["cases"]
CODE = '''def moving_average(values, window):
    if window <= 0:
        raise ValueError("window must be positive")
    out = []
    total = 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            out.append(total / window)
    return out
'''
EXTRACTIVE = [
    "Rewrite this function with the variable `out` renamed to `result`, changing nothing else.\n\n" + CODE,
    "Repeat the following text exactly.\n\nThe radix cache keeps every prompt prefix it has computed, so a "
    "second request that starts with the same system prompt reuses its keys and values instead of "
    "recomputing them. Eviction removes the least recently used leaves first.",
]


@pytest.fixture(scope="module")
def spec_engine():
    from radixlang.runtime.engine import Engine

    engine = Engine(device="cpu", kv_cache_tokens=16384, speculative_algorithm="NGRAM")
    yield engine
    engine.check_invariants()
    engine.shutdown()


def test_greedy_output_on_the_reference_prompts_equals_plain_decoding(smollm_engine, spec_engine):
    params = {"temperature": 0, "max_new_tokens": 64}
    ids = [c["input_ids"] for c in REFERENCE]
    plain = smollm_engine.generate(input_ids=ids, sampling_params=params)
    spec = spec_engine.generate(input_ids=ids, sampling_params=params)
    for p, s in zip(plain, spec):
        assert s.output_ids == p.output_ids and s.meta.finish_reason == p.meta.finish_reason
    spec_engine.check_invariants()


def test_greedy_extractive_output_equals_plain_decoding_with_long_accepted_runs(smollm_engine, spec_engine):
    tok = smollm_engine.tokenizer
    prompts = [tok.apply_chat_template([{"role": "user", "content": p}]) for p in EXTRACTIVE]
    params = {"temperature": 0, "max_new_tokens": 160}
    before = spec_engine.stats()
    plain = smollm_engine.generate(prompts, params)
    spec = spec_engine.generate(prompts, params)
    assert [s.output_ids for s in spec] == [p.output_ids for p in plain]
    after = spec_engine.stats()
    verifies = after["spec_verify_steps_total"] - before["spec_verify_steps_total"]
    accepted = after["spec_accepted_tokens_total"] - before["spec_accepted_tokens_total"]
    assert verifies and accepted / verifies > 2.0, "extractive text is mostly drafted"
    spec_engine.check_invariants()
