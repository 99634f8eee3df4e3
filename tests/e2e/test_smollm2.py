"""The real SmolLM2-135M-Instruct against HF transformers' greedy outputs (recorded in tests/data)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

REFERENCE = json.loads((Path(__file__).parents[1] / "data" / "hf_greedy_smollm2.json").read_text())["cases"]
FEW_SHOT = (
    "Answer each question with one word.\n"
    "Q: What color is the sky on a clear day? A: Blue\n"
    "Q: What animal barks? A: Dog\n"
    "Q: What is frozen water called? A: Ice\n"
)
QUESTIONS = ["What do bees make?", "What is the opposite of hot?", "What planet do we live on?",
             "What do cows drink?"]


@pytest.fixture(scope="module")
def reference_outputs(smollm_engine):
    params = {"temperature": 0, "max_new_tokens": 64}
    return smollm_engine.generate(input_ids=[c["input_ids"] for c in REFERENCE], sampling_params=params)


def test_greedy_ids_match_transformers_on_at_least_95_percent(reference_outputs):
    exact = [out.output_ids == case["output_ids"] for case, out in zip(REFERENCE, reference_outputs)]
    assert sum(exact) >= 0.95 * len(REFERENCE), f"{sum(exact)}/{len(REFERENCE)} exact"


@pytest.mark.parametrize("index", [0, 1, 7, 12, 15], ids=lambda i: REFERENCE[i]["prompt"][:20])
def test_greedy_text_equals_recorded_transformers_text(reference_outputs, index):
    case, out = REFERENCE[index], reference_outputs[index]
    expected = case["output_text"].removesuffix("<|im_end|>")
    assert out.text == expected
    finished = case["output_ids"][-1] == 2
    assert out.meta.finish_reason == ("stop" if finished else "length")


def test_first_step_logprobs_match_transformers(smollm_engine):
    for case in REFERENCE[:6]:
        out = smollm_engine.generate(input_ids=case["input_ids"], sampling_params={"temperature": 0,
                                     "max_new_tokens": 1}, return_logprob=True, top_logprobs_num=5)
        top = out.meta.output_logprobs[0].top
        assert [t for t, _ in top][:3] == [t for t, _ in case["first_step_top5"]][:3]
        ref = dict((t, lp) for t, lp in case["first_step_top5"])
        for token, lp in top:
            if token in ref:
                assert abs(lp - ref[token]) < 1e-3


def test_shared_prefix_batch_hits_cache_and_matches_cache_off(smollm_engine):
    from radixlang.runtime.engine import Engine

    params = {"temperature": 0, "max_new_tokens": 8, "stop": "\n"}
    prompts = [FEW_SHOT + f"Q: {q} A:" for q in QUESTIONS]
    smollm_engine.generate(FEW_SHOT, {"max_new_tokens": 0})
    on = smollm_engine.generate(prompts, params)
    assert all(o.meta.cached_tokens > 0 for o in on)
    with Engine(device="cpu", kv_cache_tokens=4096, disable_radix_cache=True, quantization="none") as off_engine:
        off = off_engine.generate(prompts, params)
        assert all(o.meta.cached_tokens == 0 for o in off)
        off_engine.check_invariants()
    assert [o.text for o in on] == [o.text for o in off]
    assert on[0].text.strip().lower().startswith("honey")


def test_chat_template_prompt_gives_sensible_answer(smollm_engine):
    prompt = smollm_engine.tokenizer.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}])
    out = smollm_engine.generate(prompt, {"temperature": 0, "max_new_tokens": 24})
    assert "Paris" in out.text and out.meta.finish_reason == "stop" and out.meta.matched_stop == 2
