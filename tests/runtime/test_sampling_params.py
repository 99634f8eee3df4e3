"""The request schema: each sampling field's range, checked at its edges, and errors in the caller's spelling."""
from __future__ import annotations

import dataclasses
import math

import pytest

from radixlang.runtime.sampling_params import RULES, SamplingParams
from radixlang.runtime.validation import FieldError, check_fields, check_params

VOCAB, CONTEXT = 1000, 512
# SGLang's documented ranges (lo, hi, lo excluded), temperature capped at 100 (near uniform already);
# written out here, not read from the schema
RANGES = {
    "max_new_tokens": (0, CONTEXT, False),
    "temperature": (0.0, 100.0, False),
    "top_p": (0.0, 1.0, True),
    "top_k": (-1, VOCAB, False),
    "min_p": (0.0, 1.0, False),
    "frequency_penalty": (-2.0, 2.0, False),
    "presence_penalty": (-2.0, 2.0, False),
    "repetition_penalty": (0.0, 2.0, True),
    "n": (1, 128, False),
}


def _edges(name: str) -> tuple[list, list]:
    """Values just inside and just outside a field's range."""
    lo, hi, lo_open = RANGES[name]
    step = 1 if isinstance(lo, int) else 1e-6
    inside = [lo + step if lo_open else lo] + ([hi] if math.isfinite(hi) else [10**9])
    outside = [lo if lo_open else lo - step] + ([hi + step] if math.isfinite(hi) else [])
    return inside, outside


@pytest.mark.parametrize("name", sorted(RANGES))
def test_each_numeric_field_accepts_its_range_and_rejects_what_lies_outside(name):
    inside, outside = _edges(name)
    for value in inside:
        check_params(SamplingParams(**{name: value}), VOCAB, CONTEXT)
    for value in outside:
        with pytest.raises(FieldError) as e:
            check_params(SamplingParams(**{name: value}), VOCAB, CONTEXT)
        assert e.value.field == name and str(e.value).startswith(f"{name} must be in ")


def test_min_new_tokens_is_bounded_by_max_new_tokens():
    check_params(SamplingParams(max_new_tokens=4, min_new_tokens=4), VOCAB, CONTEXT)
    with pytest.raises(FieldError, match=r"min_new_tokens must be in \[0, 4\], got 5"):
        check_params(SamplingParams(max_new_tokens=4, min_new_tokens=5), VOCAB, CONTEXT)


@pytest.mark.parametrize("values, field, words", [
    ({"stop": ["ok", ""]}, "stop", "non-empty string"),
    ({"stop_token_ids": [VOCAB]}, "stop_token_ids", f"token ids in [0, {VOCAB})"),
    ({"ignore_eos": 1}, "ignore_eos", "must be a boolean"),
    ({"seed": 1.5}, "seed", "must be an integer"),
    ({"top_k": True}, "top_k", "must be an integer"),
    ({"temperature": float("nan")}, "temperature", "must be a finite number"),
    ({"temperature": math.inf}, "temperature", "must be a finite number"),
    ({"regex": 5}, "regex", "must be a string"),
    ({"regex": "a", "grammar": "start: 'a'"}, "grammar", "regex and grammar are exclusive"),
])
def test_other_fields_reject_bad_values_naming_the_field(values, field, words):
    with pytest.raises(FieldError) as e:
        check_fields(values, vocab_size=VOCAB, context_length=CONTEXT)
    assert e.value.field == field and words in str(e.value)


def test_errors_spell_the_field_and_its_bounds_as_the_caller_does():
    names = {"max_new_tokens": "max_tokens", "min_new_tokens": "min_tokens"}
    with pytest.raises(FieldError) as e:
        check_params(SamplingParams(max_new_tokens=CONTEXT + 1), VOCAB, CONTEXT, names=names)
    assert (e.value.field, str(e.value)) == ("max_tokens", f"max_tokens must be in [0, {CONTEXT}], got {CONTEXT + 1}")
    with pytest.raises(FieldError) as e:  # max_new_tokens unknown: the bound is named, in the caller's spelling
        check_fields({"min_new_tokens": -1}, names=names)
    assert str(e.value) == "min_tokens must be in [0, max_tokens], got -1"


def test_limits_not_known_yet_are_left_to_the_engine():
    check_fields({"max_new_tokens": 10**9, "top_k": 10**9, "stop_token_ids": [10**9], "min_new_tokens": 10**9})
    with pytest.raises(FieldError, match=r"top_k must be in \[-1, 1000\]"):
        check_fields({"top_k": 10**9}, vocab_size=VOCAB)


def test_every_field_has_exactly_one_rule_and_the_defaults_pass_it():
    assert list(RULES) == [f.name for f in dataclasses.fields(SamplingParams)]
    check_params(SamplingParams(), VOCAB, CONTEXT)
    assert SamplingParams().stop is not SamplingParams().stop  # a fresh list per request
