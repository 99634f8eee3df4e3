"""Choice methods on hand-computed log-probabilities."""
from __future__ import annotations

import pytest

import radixlang as rl
from radixlang.lang.choices import decide, resolve_method


def entries(*logprobs):
    return [(lp, 100 + i, None) for i, lp in enumerate(logprobs)]


CHOICES = ["alpha", "beta", "gamma"]
SCORED = [entries(-1.0, -3.0), entries(-0.5, -2.0, -1.0), entries(-2.5)]  # means -2.0, -1.1667, -2.5


def test_token_length_normalized_picks_the_best_mean_logprob():
    index, meta = decide(rl.token_length_normalized, CHOICES, SCORED, None)
    assert index == 1
    assert meta["normalized_prompt_logprobs"] == pytest.approx([-2.0, -3.5 / 3, -2.5])
    assert meta["input_token_logprobs"] == SCORED


def test_greedy_token_selection_compares_position_by_position_padding_with_the_mean():
    scored = [entries(-1.0, -0.2), entries(-1.0, -0.7, -0.1), entries(-1.5)]
    index, meta = decide(rl.greedy_token_selection, ["a", "b", "c"], scored, None)
    # position 0: a and b tie at -1.0 (c drops out); position 1: a has -0.2 > -0.7
    assert index == 0
    assert meta["greedy_logprob_matrix"] == [[-1.0, -0.2, -0.6], [-1.0, -0.7, -0.1], [-1.5, -1.5, -1.5]]


def test_greedy_token_selection_uses_the_mean_of_a_shorter_choice():
    scored = [entries(-1.0), entries(-1.0, -2.0)]  # at position 1, "a" stands in with -1.0 > -2.0
    assert decide(rl.greedy_token_selection, ["a", "b"], scored, None)[0] == 0


def test_unconditional_likelihood_normalized_subtracts_the_choice_alone_logprobs():
    uncond = [[(None, 1, None), (-4.0, 2, None)], [(None, 3, None), (-0.5, 4, None), (-0.5, 5, None)],
              [(None, 6, None)]]
    index, meta = decide(rl.unconditional_likelihood_normalized, CHOICES, SCORED, uncond)
    expected = [(-1.0 + (-3.0 + 4.0)) / 2, (-0.5 + (-2.0 + 0.5) + (-1.0 + 0.5)) / 3, -2.5]
    assert meta["normalized_unconditional_prompt_logprobs"] == pytest.approx(expected)
    assert index == 0  # token_length_normalized would pick "beta"


def test_unconditional_method_requires_unconditional_logprobs():
    with pytest.raises(ValueError, match="needs unconditional"):
        decide(rl.unconditional_likelihood_normalized, CHOICES, SCORED, None)


def test_ties_go_to_the_first_choice():
    assert decide(rl.token_length_normalized, ["x", "y"], [entries(-1.0), entries(-1.0)], None)[0] == 0


def test_custom_sglang_style_methods_are_called_with_sglang_keywords():
    def shortest(*, choices, normalized_prompt_logprobs, input_token_logprobs, output_token_logprobs,
                 unconditional_token_logprobs=None):
        return rl.ChoicesDecision(min(choices, key=len), {"custom": True})

    index, meta = decide(shortest, ["long one", "s", "mid"], [entries(-1.0)] * 3, None)
    assert index == 1 and meta["custom"] is True

    with pytest.raises(ValueError, match="not one of the choices"):
        decide(lambda **kw: rl.ChoicesDecision("other"), ["a"], [entries(-1.0)], None)


def test_methods_resolve_by_name_and_reject_unknown_ones():
    assert resolve_method("greedy_token_selection") is rl.greedy_token_selection
    with pytest.raises(ValueError, match="choice method must be one of"):
        resolve_method("coin_flip")
    with pytest.raises(TypeError, match="choices_method"):
        resolve_method(42)
