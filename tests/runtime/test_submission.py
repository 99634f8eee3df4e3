"""The one request path: `Engine.prepare` (`RequestValidator.build`) validates a call once into Submissions,
`Engine.submit` runs them, and the generate forms are adapters over the two (same outputs)."""
from __future__ import annotations

import queue

import pytest

from radixlang.runtime import validation
from radixlang.runtime.validation import FieldError

GREEDY = {"temperature": 0, "max_new_tokens": 6, "ignore_eos": True}


@pytest.fixture
def engine(tiny_engine_factory):
    return tiny_engine_factory()


def test_prepare_gives_one_submission_per_prompt_and_sample_with_seeds_offset(engine):
    batch = engine.prepare(["a b", "c d"], {**GREEDY, "n": 2, "seed": 7}, rid=["x", "y"])
    assert batch.rids == ["x-0", "x-1", "y-0", "y-1"] and not batch.single and batch.n == 2
    assert [s.params.seed for s in batch.requests] == [7, 8, 7, 8]
    assert all(s.params.n == 1 for s in batch.requests)
    assert batch.groups() == {"x": ["x-0", "x-1"], "y": ["y-0", "y-1"]}
    assert len(batch.shared_prefills) == 2  # each prompt's KV computed once for its two samples


def test_priority_reaches_every_submission_and_the_shared_prefills(engine):
    batch = engine.prepare(["a b", "c d"], {**GREEDY, "n": 2}, priority=3)
    assert [s.priority for s in batch.requests + batch.shared_prefills] == [3] * 6
    assert engine.prepare("a b", GREEDY).requests[0].priority == 0  # SGLang's default


def test_a_call_is_validated_once_and_its_samples_share_the_checked_params(engine, monkeypatch):
    checks = []
    real = validation.check_fields
    monkeypatch.setattr(validation, "check_fields", lambda *a, **k: checks.append(1) or real(*a, **k))
    batch = engine.prepare(["a b", "c d"], {**GREEDY, "n": 2})
    assert len(checks) == 1 and len(batch.requests) == 4
    assert all(s.params.temperature == 0 and s.params.n == 1 for s in batch.requests)
    engine.run(batch)  # nothing on the way to the sampler checks a field again
    assert len(checks) == 1


@pytest.mark.parametrize("call, field", [
    (dict(sampling_params={"temperature": -1}), "temperature"),
    (dict(rid=["same", "same"]), "rid"),
    (dict(top_logprobs_num=-1), "top_logprobs_num"),
    (dict(priority="high"), "priority"),
    (dict(priority=True), "priority"),
])
def test_prepare_refuses_bad_fields_naming_them(engine, call, field):
    with pytest.raises((ValueError, FieldError), match=field):
        engine.prepare(["p one", "p two"], **call)


def test_submit_streams_the_same_tokens_as_generate(engine):
    expected = engine.generate("The quick brown fox", GREEDY).output_ids
    [sub] = engine.prepare("The quick brown fox", GREEDY).requests
    inbox: queue.Queue = queue.Queue()
    engine.submit(sub, inbox.put)
    chunks = [inbox.get()]
    while not chunks[-1].finished:
        chunks.append(inbox.get())
    assert [t for c in chunks for t in c.token_ids] == expected
    assert chunks[-1].rid == sub.rid and chunks[-1].finish_reason == "length"
