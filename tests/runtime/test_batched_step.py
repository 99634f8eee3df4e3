"""The batched step: one sampler call and one device-to-host copy per step, whatever the batch holds;
items carry explicit positions and parents."""
from __future__ import annotations

import pytest
import torch

from radixlang.runtime.batch import ScheduledItem, StepBatch
from radixlang.runtime.engine import create_req
from radixlang.runtime.execution import output_processor, sampler
from radixlang.runtime.execution.output_processor import OutputProcessor
from radixlang.runtime.sampling_params import SamplingParams

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}, "ok": {"type": "boolean"}},
          "required": ["name", "ok"]}


def test_each_step_copies_to_the_host_exactly_once(tiny_engine_factory, monkeypatch):
    engine = tiny_engine_factory()
    copies, rows = [], []  # per step: device-to-host copies, rows sampled or scored
    real_copy, real_sample, real_step = sampler.to_host, output_processor.sample_step, engine.core.step

    def counting_copy(t):
        copies[-1] += 1
        return real_copy(t)

    def counting_sample(logits, sample_rows, samples, score_rows, scores):
        rows[-1] += len(samples) + len(scores)
        return real_sample(logits, sample_rows, samples, score_rows, scores)

    def counting_step():
        copies.append(0)
        rows.append(0)
        return real_step()

    monkeypatch.setattr(sampler, "to_host", counting_copy)
    monkeypatch.setattr(output_processor, "sample_step", counting_sample)
    monkeypatch.setattr(engine.core, "step", counting_step)
    # greedy and seeded sampling, penalties, logprobs (prompt and output), a constraint with jump-forward
    engine.generate(["alpha beta gamma", "one two three four"],
                    {"temperature": 0, "max_new_tokens": 12, "ignore_eos": True})
    engine.generate("seeded", {"temperature": 0.8, "top_p": 0.9, "top_k": 20, "seed": 3, "max_new_tokens": 8,
                               "frequency_penalty": 0.5, "repetition_penalty": 1.2, "n": 3})
    engine.generate("score me please", {"max_new_tokens": 4}, return_logprob=True, logprob_start_len=0,
                    top_logprobs_num=3)
    out = engine.generate("json:", {"json_schema": SCHEMA, "temperature": 0, "max_new_tokens": 40})
    assert engine.stats()["jump_forward_tokens_total"] > 0 and out.meta.finish_reason == "stop"
    busy = [(c, r) for c, r in zip(copies, rows) if r]
    assert len(busy) > 20 and max(rows) > 3  # some steps held several requests' rows
    assert all(c == 1 for c, _ in busy), busy
    assert all(c == 0 for c, r in zip(copies, rows) if not r)  # e.g. a prefill that samples nothing
    engine.check_invariants()


class _Req:
    """Just what ScheduledItem reads."""

    def __init__(self, prompt: list[int], output: list[int]):
        self.prompt_ids, self.output_ids, self.max_new_tokens = prompt, output, 100
        self.num_draft, self.wants_prompt_logprobs, self.row = 0, False, 0  # num_draft: trailing draft nodes

    @property
    def fill_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    def tokens(self, start: int, end: int) -> list[int]:
        return (self.prompt_ids + self.output_ids)[start:end]


def test_tree_items_take_positions_from_depth_and_chains_from_order():
    req = _Req([1, 2, 3, 4], [5, 6, 7, 8, 9])
    chain = ScheduledItem(req, 4, 5)
    tree = ScheduledItem(req, 4, 5, parents=[-1, 0, 0, 2, -1])
    assert chain.positions() == [4, 5, 6, 7, 8]
    assert tree.positions() == [4, 5, 5, 6, 4]
    batch = StepBatch([tree]).attention_batch(torch.zeros(1, 16, dtype=torch.int32))
    assert batch.positions == [4, 5, 5, 6, 4] and batch.parents == [[-1, 0, 0, 2, -1]]
    assert batch.kv_lens == [9] and batch.extend_lens == [5]


def test_logit_rows_cover_prompt_scores_drafts_and_the_next_token():
    req = _Req([1, 2, 3, 4, 5, 6], [7, 8, 9])
    req.num_draft = 2
    decode = _Req([1, 2], [3])
    batch = StepBatch([ScheduledItem(decode, 2, 1), ScheduledItem(req, 5, 4)])
    first, second = batch.rows
    assert list(first.samples) == [0] and not first.prompt
    # req: tokens at positions 5..8; the root (position 6) and drafts 8, 9 (positions 7, 8) are sampled
    assert list(second.samples) == [1, 2, 3]
    assert batch.hidden_rows == [0, 1 + 1, 1 + 2, 1 + 3]


def test_greedy_fast_path_gives_the_full_samplers_tokens_and_stops(tiny_engine_factory, monkeypatch):
    """Plain greedy steps take one argmax (`_greedy_step`); the full sampler, forced, is the oracle."""
    engine = tiny_engine_factory()
    prompts = ["alpha beta gamma", "one two three four", "the cat"]
    free = engine.generate(prompts, {"temperature": 0, "max_new_tokens": 20, "ignore_eos": True})
    params = [{"temperature": 0, "max_new_tokens": 20, "ignore_eos": True},
              {"temperature": 0, "max_new_tokens": 30, "stop": [" the", "ing"]},
              {"temperature": 0, "max_new_tokens": 20, "stop_token_ids": [o.output_ids[6] for o in free]}]
    fast_steps = []
    real_greedy = sampler._greedy_step
    monkeypatch.setattr(sampler, "_greedy_step", lambda *a: fast_steps.append(1) or real_greedy(*a))
    runs = []
    for force_full in (False, True):
        if force_full:
            monkeypatch.setattr(sampler.SampleRow, "plain_greedy", property(lambda row: False))
        engine.flush_cache()
        before = len(fast_steps)
        runs.append([[(o.output_ids, o.text, o.meta.finish_reason, o.meta.matched_stop)
                      for o in engine.generate(prompts, p)] for p in params])
        assert (len(fast_steps) > before) != force_full
    assert runs[0] == runs[1]
    stops = {type(matched) for run in runs[0][1:] for _, _, reason, matched in run if reason == "stop"}
    assert stops == {str, int}  # both stop strings and stop tokens ended some request
    engine.check_invariants()


@pytest.mark.parametrize("params, logprobs", [
    ({"temperature": 0}, False), ({"temperature": 0.7, "top_k": 5}, False),
    ({"temperature": 0, "min_new_tokens": 3}, True), ({"frequency_penalty": 0.5, "repetition_penalty": 1.2}, True),
])
def test_root_row_is_the_general_rows_of_a_request_with_no_draft_or_constraint(tokenizer, params, logprobs):
    """The per-row shortcut for undrafted, unconstrained requests against `_sample_rows`, as the output grows."""
    sp = SamplingParams(**params)
    req = create_req("r", tokenizer.encode("Hi there"), sp, tokenizer, lambda c: None, context_length=64, seed=3,
                     device=torch.device("cpu"), return_logprob=logprobs, top_logprobs_num=2 if logprobs else 0)
    for token in [11, 12, 13, 14]:
        [general] = OutputProcessor._sample_rows(req)
        root = OutputProcessor._root_row(req)
        assert root.state is general.state
        assert (root.counter, root.block_stop, root.assumed, root.mask, root.top_logprobs) == \
            (general.counter, general.block_stop, general.assumed, general.mask, general.top_logprobs)
        req.output_ids.append(token)
