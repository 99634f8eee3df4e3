"""Sampler semantics against direct definitions of each transform."""
from __future__ import annotations

from collections import Counter

import pytest
import torch

from radixlang.runtime.sampler import SamplingState, apply_penalties, filter_probs, sample_one, token_logprobs
from radixlang.runtime.sampling_params import SamplingParams

PROBS = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])


def state(prompt=(0,), eos=(4,), seed=0, **params) -> SamplingState:
    return SamplingState.create(SamplingParams(**params), list(prompt), eos, 5, torch.device("cpu"), seed)


def test_top_k_keeps_the_k_most_likely():
    out = filter_probs(PROBS, SamplingParams(top_k=2))
    assert torch.allclose(out, torch.tensor([0, 0.4, 0, 0.3, 0]) / 0.7)


def test_top_p_keeps_smallest_head_reaching_p():
    # sorted: 0.4, 0.3, 0.15, 0.1, 0.05 -> cumulative 0.4, 0.7, 0.85: p=0.7 keeps two, p=0.71 three
    assert (filter_probs(PROBS, SamplingParams(top_p=0.7)) > 0).tolist() == [False, True, False, True, False]
    assert (filter_probs(PROBS, SamplingParams(top_p=0.71)) > 0).tolist() == [False, True, False, True, True]


def test_min_p_drops_tokens_below_fraction_of_best():
    out = filter_probs(PROBS, SamplingParams(min_p=0.5))  # threshold 0.2
    assert (out > 0).tolist() == [False, True, False, True, False]


def test_frequency_and_presence_penalties_follow_openai_formula():
    s = state(frequency_penalty=0.5, presence_penalty=1.0)
    for t in (1, 1, 3):
        s.observe(t)
    out = apply_penalties(torch.zeros(5), s)
    assert out.tolist() == [0.0, -2.0, 0.0, -1.5, 0.0]


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    s = state(prompt=(0, 1), repetition_penalty=2.0)
    out = apply_penalties(torch.tensor([2.0, -2.0, 2.0, -2.0, 1.0]), s)
    assert out.tolist() == [1.0, -4.0, 2.0, -2.0, 1.0]
    s.observe(2)
    assert apply_penalties(torch.tensor([2.0, -2.0, 2.0, -2.0, 1.0]), s)[2] == 1.0


def test_greedy_takes_argmax_and_mask_restricts_choice():
    logits = torch.log(PROBS)
    assert sample_one(logits, state(temperature=0.0), None, False) == 1
    mask = torch.tensor([True, False, True, False, False])
    assert sample_one(logits, state(temperature=0.0), mask, False) == 2


def test_block_stop_forbids_eos_and_stop_ids_until_min_tokens():
    logits = torch.tensor([0.0, 0.0, 0.0, 5.0, 10.0])
    assert sample_one(logits, state(temperature=0.0, stop_token_ids=[3]), None, True) not in (3, 4)
    assert sample_one(logits, state(temperature=0.0, ignore_eos=True), None, False) == 4


def test_same_seed_same_samples_and_frequencies_match_distribution():
    logits = torch.log(PROBS)
    s1, s2 = state(seed=7, temperature=1.0), state(seed=7, temperature=1.0)
    draws1 = [sample_one(logits, s1, None, False) for _ in range(4000)]
    draws2 = [sample_one(logits, s2, None, False) for _ in range(4000)]
    assert draws1 == draws2
    freq = Counter(draws1)
    for token, p in enumerate(PROBS.tolist()):
        assert abs(freq[token] / 4000 - p) < 0.03


def test_temperature_sharpens_distribution():
    logits = torch.log(PROBS)
    s = state(seed=1, temperature=0.25)
    freq = Counter(sample_one(logits, s, None, False) for _ in range(2000))
    expected = torch.softmax(logits / 0.25, -1)[1].item()
    assert abs(freq[1] / 2000 - expected) < 0.04


def test_token_logprobs_are_raw_log_softmax_with_top_k():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    (lp,) = token_logprobs(logits, torch.tensor([2]), top_k=2)
    ref = torch.log_softmax(logits[0], -1)
    assert lp.token_id == 2 and lp.logprob == pytest.approx(ref[2].item())
    assert [t for t, _ in lp.top] == [1, 2]


def test_a_temperature_too_small_to_divide_by_samples_greedily():
    logits = torch.log(PROBS)  # dividing by 1e-98 would overflow to inf and make NaN probabilities
    assert [sample_one(logits, state(temperature=1e-98, seed=s), None, False) for s in range(4)] == [1] * 4


@pytest.mark.parametrize("params, words", [
    ({"temperature": float("inf")}, "temperature must be a finite number"),
    ({"temperature": 1e308}, "temperature must be in [0.0, 100.0]"),
    ({"top_p": float("nan")}, "top_p must be a finite number"),
    ({"frequency_penalty": float("-inf")}, "frequency_penalty must be a finite number"),
    ({"seed": 2**70}, "seed must be in [-9223372036854775808, 18446744073709551615]"),
    ({"seed": 2**64 - 1, "n": 2}, "18446744073709551614]"),  # sample 1 seeds with seed + 1
])
def test_validate_refuses_non_finite_and_overflowing_numbers(params, words):
    with pytest.raises(ValueError) as e:
        SamplingParams(max_new_tokens=1, **params).validate(vocab_size=5, context_length=8)
    assert words in str(e.value)


def test_validate_takes_every_torch_seed():
    for seed in (-(2**63), -1, 0, 2**64 - 1):
        SamplingParams(max_new_tokens=1, seed=seed).validate(vocab_size=5, context_length=8)
        state(seed=seed)
