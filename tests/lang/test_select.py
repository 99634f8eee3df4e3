"""select on the tiny model: scores match brute-force scoring, healing at the boundary, one batched call."""
from __future__ import annotations

import pytest

import radixlang as rl
from radixlang.lang.choices import decide

PREFIX = "Question: which city is the capital of France? The answer is"
CHOICES = [" Paris", " London", " Rome and Milan", " Paris, France"]


def common_len(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def brute_force(oracle_engine, prefix: str, choices: list[str]) -> tuple[list[list[tuple]], list[int]]:
    """Each prefix + choice scored alone, from scratch; scoring starts where any choice's tokens first
    differ from the prefix's own tokens."""
    tok = oracle_engine.tokenizer
    prefix_ids = tok.encode(prefix)
    full = [tok.encode(prefix + c) for c in choices]
    start = min(common_len(prefix_ids, ids) for ids in full)
    scored = []
    for ids in full:
        out = oracle_engine.generate(input_ids=ids, sampling_params={"max_new_tokens": 0}, return_logprob=True,
                                     logprob_start_len=1)
        scored.append([(lp.logprob, lp.token_id, None) for lp in out.meta.input_logprobs][start - 1:])
    return scored, [ids[start:] for ids in full]


@pytest.mark.parametrize("method", [rl.token_length_normalized, rl.greedy_token_selection])
def test_select_scores_every_choice_like_brute_force_scoring(backend, oracle_engine, method):
    @rl.function
    def pick(s):
        s += PREFIX + rl.select("city", CHOICES, choices_method=method)

    state = pick.run(backend=backend)
    scored, tails = brute_force(oracle_engine, PREFIX, CHOICES)
    index, expected = decide(method, CHOICES, scored, None)
    meta = state.get_meta_info("city")
    assert state["city"] == CHOICES[index]
    assert state.text() == PREFIX + CHOICES[index]
    assert [[e[1] for e in entries] for entries in meta["input_token_logprobs"]] == tails
    assert meta["normalized_prompt_logprobs"] == pytest.approx(expected["normalized_prompt_logprobs"], abs=1e-4)
    for got, want in zip(meta["input_token_logprobs"], scored):
        assert [e[0] for e in got] == pytest.approx([e[0] for e in want], abs=1e-4)


def test_unconditional_likelihood_normalized_scores_choices_alone_too(backend, oracle_engine):
    @rl.function
    def pick(s):
        s += PREFIX + rl.select("city", CHOICES, choices_method=rl.unconditional_likelihood_normalized)

    state = pick.run(backend=backend)
    scored, tails = brute_force(oracle_engine, PREFIX, CHOICES)
    unconditional = []
    for tail in tails:
        out = oracle_engine.generate(input_ids=tail, sampling_params={"max_new_tokens": 0}, return_logprob=True,
                                     logprob_start_len=1)
        unconditional.append([(None, tail[0], None)] + [(lp.logprob, lp.token_id, None)
                                                         for lp in out.meta.input_logprobs or []])
    index, expected = decide(rl.unconditional_likelihood_normalized, CHOICES, scored, unconditional)
    meta = state.get_meta_info("city")
    assert state["city"] == CHOICES[index]
    assert meta["normalized_unconditional_prompt_logprobs"] == pytest.approx(
        expected["normalized_unconditional_prompt_logprobs"], abs=1e-4)


def test_token_healing_scores_the_merged_boundary_token(backend, engine):
    prefix = "The capital of France is "  # the trailing space merges into " Paris"
    tok = engine.tokenizer
    assert tok.encode(prefix)[-1] != tok.encode(prefix + "Paris")[-1]

    @rl.function
    def pick(s):
        s += prefix + rl.select("city", ["Paris", "London"])

    state = pick.run(backend=backend)
    meta = state.get_meta_info("city")
    first_tokens = [tok.decode([entries[0][1]]) for entries in meta["input_token_logprobs"]]
    assert first_tokens == [" Paris", " London"]
    assert state.text() == prefix + state["city"]


def test_select_computes_the_prefix_once_then_scores_all_choices_in_one_call(backend, engine, monkeypatch):
    calls = []
    original = engine.generate

    def counting(*args, **kwargs):
        calls.append(kwargs.get("input_ids"))
        return original(*args, **kwargs)

    monkeypatch.setattr(engine, "generate", counting)

    @rl.function
    def pick(s):
        s += PREFIX + rl.select("city", CHOICES)

    state = pick.run(backend=backend)
    assert state.error() is None
    assert len(calls) == 2  # the prefix (prefill only), then every choice in one batch
    prefix_ids, batch = calls
    assert len(batch) == len(CHOICES)
    start = min(common_len(prefix_ids, ids) for ids in batch)
    assert all(cached >= start - 1 for cached in state.get_meta_info("city")["cached_tokens"])


def test_select_needs_text_before_it(backend):
    state = rl.function(lambda s: s.__iadd__(rl.select("x", ["a", "b"]))).run(backend=backend)
    with pytest.raises(ValueError, match="needs text before it"):
        state.sync()
