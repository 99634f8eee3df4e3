"""The batched sampler against direct definitions of each transform and against the per-request
reference sampler (tests/runtime/sampler_reference.py), row by row and draw by draw."""
from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch

from radixlang.runtime.execution import sampler as sampler_module
from radixlang.runtime.execution.sampler import (
    SampleRow,
    SamplingState,
    ScoreRow,
    apply_bitmask,
    apply_penalties,
    process_logits,
    sample_step,
    sample_tokens,
    token_distribution,
    uniform,
)
from radixlang.runtime.sampling_params import SamplingParams
from radixlang.runtime.validation import check_params
from radixlang.testing.masks import pack_mask

from .sampler_reference import distribution

PROBS = torch.tensor([0.05, 0.4, 0.1, 0.3, 0.15])


def state(prompt=(0,), eos=(4,), seed=0, vocab=5, **params) -> SamplingState:
    return SamplingState.create(SamplingParams(**params), list(prompt), eos, vocab, torch.device("cpu"), seed)


def dist(probs: torch.Tensor, **params) -> torch.Tensor:
    out = token_distribution(torch.log(probs)[None], [SamplingParams(**params)])[0]
    return out / out.sum()


def draw(logits: torch.Tensor, s: SamplingState, counter: int = 0, **row) -> int:
    return int(sample_tokens(logits.clone()[None], [SampleRow(s, counter, **row)])[0])


def test_top_k_keeps_the_k_most_likely():
    assert torch.allclose(dist(PROBS, top_k=2), torch.tensor([0, 0.4, 0, 0.3, 0]) / 0.7)


def test_top_p_keeps_smallest_head_reaching_p():
    # sorted: 0.4, 0.3, 0.15, 0.1, 0.05 -> cumulative 0.4, 0.7, 0.85: p=0.7 keeps two, p=0.71 three
    assert (dist(PROBS, top_p=0.7) > 0).tolist() == [False, True, False, True, False]
    assert (dist(PROBS, top_p=0.71) > 0).tolist() == [False, True, False, True, True]


def test_min_p_drops_tokens_below_fraction_of_best():
    assert (dist(PROBS, min_p=0.5) > 0).tolist() == [False, True, False, True, False]  # threshold 0.2


def test_frequency_and_presence_penalties_follow_openai_formula():
    s = state(frequency_penalty=0.5, presence_penalty=1.0)
    for t in (1, 1, 3):
        s.observe(t)
    out = torch.zeros(1, 5)
    apply_penalties(out, [SampleRow(s, 0)])
    assert out[0].tolist() == [0.0, -2.0, 0.0, -1.5, 0.0]


def test_repetition_penalty_divides_positive_and_multiplies_negative_seen_logits():
    s = state(prompt=(0, 1), repetition_penalty=2.0)
    out = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])
    apply_penalties(out, [SampleRow(s, 0)])
    assert out[0].tolist() == [1.0, -4.0, 2.0, -2.0, 1.0]
    s.observe(2)
    out = torch.tensor([[2.0, -2.0, 2.0, -2.0, 1.0]])
    apply_penalties(out, [SampleRow(s, 0)])
    assert out[0, 2] == 1.0


def test_assumed_draft_tokens_count_as_output_for_penalties():
    s = state(frequency_penalty=0.5)
    out = torch.zeros(2, 5)
    apply_penalties(out, [SampleRow(s, 0), SampleRow(s, 2, assumed=(3, 3))])
    assert out.tolist() == [[0.0] * 5, [0.0, 0.0, 0.0, -1.0, 0.0]]


def test_greedy_takes_argmax_and_mask_restricts_choice():
    logits = torch.log(PROBS)
    assert draw(logits, state(temperature=0.0)) == 1
    mask = pack_mask(np.array([True, False, True, False, False]))
    assert draw(logits, state(temperature=0.0), mask=mask) == 2


def test_block_stop_forbids_eos_and_stop_ids_until_min_tokens():
    logits = torch.tensor([0.0, 0.0, 0.0, 5.0, 10.0])
    assert draw(logits, state(temperature=0.0, stop_token_ids=[3]), block_stop=True) not in (3, 4)
    assert draw(logits, state(temperature=0.0, ignore_eos=True)) == 4
    only_stop = pack_mask(np.array([False, False, False, False, True]))  # min_new_tokens yields
    assert draw(logits, state(temperature=0.0), block_stop=True, mask=only_stop) == 4


def test_same_seed_same_samples_and_frequencies_match_distribution():
    logits = torch.log(PROBS).expand(4000, 5).contiguous()
    s1, s2 = state(seed=7, temperature=1.0), state(seed=7, temperature=1.0)
    draws1 = sample_tokens(logits.clone(), [SampleRow(s1, i) for i in range(4000)]).tolist()
    draws2 = sample_tokens(logits.clone(), [SampleRow(s2, i) for i in range(4000)]).tolist()
    assert draws1 == draws2
    other = sample_tokens(logits.clone(), [SampleRow(state(seed=8), i) for i in range(4000)]).tolist()
    assert other != draws1
    freq = Counter(draws1)
    for token, p in enumerate(PROBS.tolist()):
        assert abs(freq[token] / 4000 - p) < 0.03


def test_temperature_sharpens_distribution():
    logits = torch.log(PROBS).expand(2000, 5).contiguous()
    s = state(seed=1, temperature=0.25)
    freq = Counter(sample_tokens(logits, [SampleRow(s, i) for i in range(2000)]).tolist())
    expected = torch.softmax(torch.log(PROBS) / 0.25, -1)[1].item()
    assert abs(freq[1] / 2000 - expected) < 0.04


def test_uniform_draws_are_in_the_open_unit_interval_and_spread_evenly():
    u = uniform(torch.full((100_000,), 12345), torch.arange(100_000))
    assert 0.0 < u.min().item() and u.max().item() < 1.0
    hist = torch.histc(u.float(), bins=10, min=0, max=1) / 100_000
    assert (hist - 0.1).abs().max().item() < 0.005
    assert torch.equal(u, uniform(torch.full((100_000,), 12345), torch.arange(100_000)))


def test_token_logprobs_are_raw_log_softmax_with_top_k():
    logits = torch.tensor([[1.0, 3.0, 2.0]])
    out = sample_step(logits.clone(), [], [], [0], [ScoreRow(2, 2)])
    (lp,) = out.score_logprobs
    ref = torch.log_softmax(logits[0], -1)
    assert lp.token_id == 2 and lp.logprob == pytest.approx(ref[2].item())
    assert [t for t, _ in lp.top] == [1, 2]


def test_sampled_token_logprobs_come_from_the_raw_distribution_not_the_masked_one():
    logits = torch.tensor([[1.0, 3.0, 2.0], [0.5, 0.0, 0.0]])
    mask = pack_mask(np.array([True, False, True]))
    out = sample_step(logits.clone(), [0], [SampleRow(state(temperature=0.0, vocab=3), 0, mask=mask, top_logprobs=1)],
                      [1], [ScoreRow(0, 0)])
    assert out.tokens == [2]
    (lp,) = out.sample_logprobs
    assert lp.logprob == pytest.approx(torch.log_softmax(logits[0], -1)[2].item()) and lp.top[0][0] == 1
    assert out.score_logprobs[0].logprob == pytest.approx(torch.log_softmax(logits[1], -1)[0].item())


def test_bitmask_equals_the_boolean_masks_it_packs():
    rng = np.random.default_rng(0)
    vocab = 77  # not a multiple of 32: the last word is partial
    masks = [rng.random(vocab) < 0.3 for _ in range(5)] + [None]
    logits = torch.zeros(6, vocab)
    apply_bitmask(logits, [SampleRow(state(vocab=vocab), 0, mask=None if m is None else pack_mask(m)) for m in masks])
    for row, m in zip(logits, masks):
        want = np.ones(vocab, dtype=bool) if m is None else m
        assert np.array_equal(torch.isfinite(row).numpy(), want)


def _random_row(rng: random.Random, vocab: int) -> tuple[dict, list[int], list[int], np.ndarray | None, bool]:
    params = {"temperature": rng.choice([0.0, 0.5, 1.0, 1.7]), "top_k": rng.choice([-1, 1, 3, 20]),
              "top_p": rng.choice([1.0, 0.9, 0.5]), "min_p": rng.choice([0.0, 0.05, 0.3]),
              "frequency_penalty": rng.choice([0.0, 0.7]), "presence_penalty": rng.choice([0.0, -0.4]),
              "repetition_penalty": rng.choice([1.0, 1.3]), "stop_token_ids": [rng.randrange(vocab)]}
    prompt = [rng.randrange(vocab) for _ in range(4)]
    output = [rng.randrange(vocab) for _ in range(rng.randrange(4))]
    allowed = np.array([rng.random() < 0.6 for _ in range(vocab)]) if rng.random() < 0.5 else None
    return params, prompt, output, allowed, rng.random() < 0.3


def test_batched_distributions_equal_the_per_request_sampler_row_by_row():
    rng, vocab = random.Random(0), 40
    logits = torch.randn(64, vocab, generator=torch.Generator().manual_seed(0)) * 2
    rows, expected = [], []
    for i in range(64):
        params, prompt, output, allowed, block = _random_row(rng, vocab)
        s = state(prompt=prompt, eos=(0,), vocab=vocab, seed=i, **params)
        base, assumed = output[:1], tuple(output[1:])  # part observed, part an assumed draft
        for t in base:
            s.observe(t)
        rows.append(SampleRow(s, 0, block, assumed, None if allowed is None else pack_mask(allowed)))
        expected.append(distribution(logits[i], s.params, prompt, output,
                                     None if allowed is None else torch.from_numpy(allowed), set(s.stop_ids), block))
    processed = logits.clone()
    process_logits(processed, rows)
    got = token_distribution(processed, [r.state.params for r in rows])
    for i, (row, want) in enumerate(zip(rows, expected)):
        if sampler_module.is_greedy(row.state.params):
            assert processed[i].argmax() == want.argmax(), i
        else:
            assert torch.allclose(got[i] / got[i].sum(), want, atol=1e-6), i


def test_seeded_batched_draws_follow_the_per_request_distribution():
    rng, vocab, draws = random.Random(1), 12, 3000
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(1))
    for i in range(4):
        params, prompt, output, allowed, block = _random_row(rng, vocab)
        params["temperature"] = 1.0
        s = state(prompt=prompt, eos=(0,), vocab=vocab, seed=i, **params)
        mask = None if allowed is None else pack_mask(allowed)
        rows = [SampleRow(s, c, block, tuple(output), mask) for c in range(draws)]
        freq = Counter(sample_tokens(logits[i].expand(draws, vocab).clone(), rows).tolist())
        want = distribution(logits[i], s.params, prompt, output,
                            None if allowed is None else torch.from_numpy(allowed), set(s.stop_ids), block)
        for token in range(vocab):
            assert abs(freq[token] / draws - want[token].item()) < 0.035, (i, token)


def test_a_temperature_too_small_to_divide_by_samples_greedily():
    logits = torch.log(PROBS)  # dividing by 1e-98 would overflow to inf and make NaN probabilities
    assert [draw(logits, state(temperature=1e-98, seed=s)) for s in range(4)] == [1] * 4


@pytest.mark.parametrize("params, words", [
    ({"temperature": float("inf")}, "temperature must be a finite number"),
    ({"temperature": 1e308}, "temperature must be in [0.0, 100.0]"),
    ({"top_p": float("nan")}, "top_p must be a finite number"),
    ({"frequency_penalty": float("-inf")}, "frequency_penalty must be a finite number"),
    ({"seed": 2**70}, "seed must be in [-9223372036854775808, 18446744073709551615]"),
])
def test_validate_refuses_non_finite_and_overflowing_numbers(params, words):
    with pytest.raises(ValueError) as e:
        check_params(SamplingParams(max_new_tokens=1, **params), 5, 8)
    assert words in str(e.value)


def test_validate_takes_every_torch_seed():
    for seed in (-(2**63), -1, 0, 2**64 - 1):
        check_params(SamplingParams(max_new_tokens=1, seed=seed), 5, 8)
        state(seed=seed)


def _plain_greedy_rows(n: int, vocab: int) -> list[SampleRow]:
    return [SampleRow(state(vocab=vocab, temperature=0.0, seed=i), counter=i) for i in range(n)]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_plain_greedy_rows_take_one_argmax_equal_to_the_full_sampler(dtype, monkeypatch):
    vocab = 50
    logits = (torch.randn(8, vocab, generator=torch.Generator().manual_seed(2)) * 3).to(dtype)
    logits[3, [7, 30]] = logits[3].max() + 1  # a tie: both paths must take the same (first) index
    rows = _plain_greedy_rows(6, vocab)
    sample_rows = [0, 2, 3, 4, 6, 7]
    want = sample_tokens(logits[sample_rows].float(), rows).tolist()  # the full path, the oracle

    def full_path(*args):
        raise AssertionError("plain greedy rows must not run the full sampler")

    monkeypatch.setattr(sampler_module, "sample_tokens", full_path)
    got = sample_step(logits.clone(), sample_rows, rows, [], [])
    assert got.tokens == want and want[2] == 7
    assert got.sample_logprobs == [None] * 6 and got.score_logprobs == []


@pytest.mark.parametrize("change", ["mask", "block_stop", "penalty", "logprobs", "temperature", "score"])
def test_one_row_needing_processing_sends_the_step_through_the_full_sampler(change):
    vocab = 50
    logits = torch.randn(4, vocab, generator=torch.Generator().manual_seed(3)) * 3
    rows, scores = _plain_greedy_rows(4, vocab), []
    best = int(logits[1].argmax())
    if change == "mask":
        rows[1].mask = pack_mask(np.arange(vocab) != best)
    elif change == "block_stop":
        rows[1] = SampleRow(state(vocab=vocab, eos=(best,), temperature=0.0), 0, block_stop=True)
    elif change == "penalty":
        rows[1] = SampleRow(state(prompt=(best,), vocab=vocab, temperature=0.0, repetition_penalty=100.0), 0)
    elif change == "logprobs":
        rows[1].top_logprobs = 2
    elif change == "temperature":
        rows[1] = SampleRow(state(vocab=vocab, temperature=1.0, seed=5), 0)
    else:
        scores = [ScoreRow(target=0, top_logprobs=0)]
    got = sample_step(logits.clone(), [0, 1, 2, 3], rows, [0] if scores else [], scores)
    assert not all(r.plain_greedy for r in rows) or scores
    assert got.tokens == sample_tokens(logits.clone(), rows).tolist()
    if change in ("mask", "block_stop", "penalty"):
        assert got.tokens[1] != best  # the processing changed the row's choice
    if change == "logprobs":
        want = torch.log_softmax(logits[1], dim=-1)[best].item()
        assert got.sample_logprobs[1].token_id == best and abs(got.sample_logprobs[1].logprob - want) < 1e-5
        assert len(got.sample_logprobs[1].top) == 2
    if change == "score":
        assert abs(got.score_logprobs[0].logprob - torch.log_softmax(logits[0], dim=-1)[0].item()) < 1e-5
