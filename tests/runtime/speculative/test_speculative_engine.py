"""Speculative decoding on the tiny model. The oracle is the same engine configuration without
speculation: greedy and seeded outputs (tokens, text, logprobs, finish reasons) must be identical,
since a draft only changes how many tokens one step verifies, and the KV that speculation leaves in the
radix tree must equal plain decoding's."""
from __future__ import annotations

import random
from collections import defaultdict

import pytest
import torch

from radixlang.runtime.config import EngineConfig
from radixlang.runtime.draft_tree import DraftTree
from radixlang.runtime.engine import create_req, create_scheduler
from radixlang.runtime.execution import output_processor
from radixlang.runtime.request import Req
from radixlang.runtime.speculative.drafter import NgramDrafter
from radixlang.runtime.validation import check_params, parse_params

from .scripted import ScriptedDrafter

SPEC = {"speculative_algorithm": "NGRAM"}
PROMPTS = [
    "the cat sat on the mat and the cat sat on the mat and the cat",
    "one two three one two three one two three one",
    "1, 2, 3, 4, 5, 1, 2, 3, 4, 5, 1, 2,",
    "Dear hiring manager, I am writing to apply for",
]
GREEDY = {"temperature": 0, "max_new_tokens": 48, "ignore_eos": True}
SAMPLED = [
    {"temperature": 0.9, "seed": 7, "max_new_tokens": 40, "ignore_eos": True},
    {"temperature": 0.6, "top_k": 8, "top_p": 0.95, "seed": 3, "max_new_tokens": 64, "ignore_eos": True,
     "frequency_penalty": 0.1, "repetition_penalty": 1.05},
]


def run_pair(factory, prompts, params, **kwargs):
    plain = factory().generate(prompts, params, **kwargs)
    spec_engine = factory(**SPEC)
    spec = spec_engine.generate(prompts, params, **kwargs)
    return plain, spec, spec_engine.stats()


def assert_same(plain, spec):
    for a, b in zip(plain, spec):
        assert b.output_ids == a.output_ids
        assert b.text == a.text
        assert (b.meta.finish_reason, b.meta.matched_stop) == (a.meta.finish_reason, a.meta.matched_stop)


@pytest.mark.parametrize("params", [GREEDY, *SAMPLED], ids=["greedy", "sampled", "sampled-penalties"])
def test_outputs_equal_plain_decoding_with_accepted_and_rejected_drafts(tiny_engine_factory, params):
    plain, spec, stats = run_pair(tiny_engine_factory, PROMPTS, params)
    assert_same(plain, spec)
    assert stats["spec_accepted_tokens_total"] > 0, "some drafts were accepted"
    assert stats["spec_draft_tokens_total"] > stats["spec_accepted_tokens_total"], "and some rejected"


def test_logprobs_equal_plain_decoding(tiny_engine_factory):
    params = {**GREEDY, "max_new_tokens": 24}
    plain, spec, stats = run_pair(tiny_engine_factory, PROMPTS[:2], params, return_logprob=True,
                                  top_logprobs_num=3, logprob_start_len=0)
    assert_same(plain, spec)
    assert stats["spec_accepted_tokens_total"] > 0
    for a, b in zip(plain, spec):
        assert len(b.meta.output_logprobs) == len(b.output_ids)
        for x, y in zip(a.meta.output_logprobs + a.meta.input_logprobs, b.meta.output_logprobs + b.meta.input_logprobs):
            assert x.token_id == y.token_id and x.logprob == pytest.approx(y.logprob, abs=1e-4)
            assert [t for t, _ in x.top] == [t for t, _ in y.top]


def test_stops_and_max_new_tokens_inside_an_accepted_run_end_where_plain_decoding_does(tiny_engine_factory,
                                                                                        monkeypatch):
    plain_engine, spec_engine = tiny_engine_factory(), tiny_engine_factory(**SPEC)
    free = plain_engine.generate(PROMPTS[0], GREEDY)
    ids = free.output_ids
    tok = plain_engine.tokenizer
    chunk_sizes: dict[str, list[int]] = defaultdict(list)
    real_emit = output_processor.emit

    def recording_emit(req, text, token_ids, logprobs):
        chunk_sizes[req.rid].append(len(token_ids))
        return real_emit(req, text, token_ids, logprobs)

    monkeypatch.setattr(output_processor, "emit", recording_emit)
    cases = []
    for k in range(4, len(ids) - 2, 3):
        cases.append({**GREEDY, "stop": [tok.decode(ids[k:k + 2])]})  # a stop string
        cases.append({**GREEDY, "stop_token_ids": [ids[k]], "ignore_eos": False})  # a stop token, like EOS
        cases.append({**GREEDY, "max_new_tokens": k})
    cut_inside_a_run = 0
    for i, params in enumerate(cases):
        a = plain_engine.generate(PROMPTS[0], params)
        b = spec_engine.generate(PROMPTS[0], params, rid=f"case-{i}")
        assert_same([a], [b])
        cut_inside_a_run += chunk_sizes[f"case-{i}"][-1] > 1
    assert cut_inside_a_run >= 3, "several requests ended inside a multi-token verified run"


class OracleDrafter(ScriptedDrafter):
    """Proposes the known plain output's next tokens as one branch, with random siblings and junk."""

    def __init__(self, truth: dict[str, list[int]], extra: list[int], seed: int):
        self.truth, self.extra, self.rng = truth, extra, random.Random(seed)
        self.proposed = 0

    def propose_one(self, req: Req, room: int) -> DraftTree:
        tokens, parents = [], []
        ahead = self.truth[req.rid][len(req.output_ids):][:min(room, self.rng.randint(0, 6))]
        for token in ahead:  # the true branch, with a junk sibling at each level
            sibling = len(tokens) - 2 if tokens else -1
            parents += [sibling, sibling]
            tokens += [self.rng.choice(self.extra), token] if self.rng.random() < 0.5 else [token, self.rng.choice(self.extra)]
        tokens, parents = tokens[:room], parents[:room]
        parents = [p if p < 0 or tokens[p] in ahead else -1 for p in parents]
        self.proposed += len(tokens)
        return DraftTree(tokens, parents)



def test_draft_nodes_outside_the_constraint_are_pruned_before_verification(tiny_engine_factory):
    regex = r"[a-z ]{1,80}"  # nothing forced: every draft comes from the drafter
    params = {"temperature": 0, "max_new_tokens": 64, "regex": regex}
    prompts = ["the cat sat", "on the mat"]
    plain = tiny_engine_factory().generate(prompts, params)
    engine = tiny_engine_factory()
    tok = engine.tokenizer
    forbidden = tok.encode(", X.", add_special_tokens=False) + [tok.eos_token_ids[0]]
    drafter = OracleDrafter({f"p{i}": o.output_ids for i, o in enumerate(plain)}, forbidden, seed=0)
    engine.core.set_drafter(drafter)
    spec = engine.generate(prompts, params, rid=["p0", "p1"])
    assert_same(plain, spec)
    stats = engine.stats()
    assert stats["spec_accepted_tokens_total"] > 0
    assert 0 < stats["spec_draft_tokens_total"] < drafter.proposed, "forbidden nodes were pruned"
    import re

    assert all(re.fullmatch(regex, o.text) for o in spec)


LIST_SCHEMA = {"type": "object", "properties": {
    "title": {"type": "string", "maxLength": 24},
    "steps": {"type": "array", "items": {"enum": ["mix the flour", "add water", "bake"]}, "maxItems": 4},
    "codes": {"type": "array", "items": {"type": "integer", "minimum": 0, "maximum": 99}, "minItems": 16,
              "maxItems": 24}},  # numbers that repeat: what the n-gram drafts from the output so far
    "required": ["title", "steps", "codes"], "additionalProperties": False}


@pytest.mark.parametrize("params", [GREEDY, SAMPLED[0]], ids=["greedy", "sampled"])
def test_json_schema_with_ngram_drafts_equals_constrained_decoding_without(tiny_engine_factory, params):
    """Speculation and constraints together: draft trees are pruned by the constraint at every node and
    verified against masked rows, with jump-forward drafts in between (enum items and keys are forced)."""
    import json

    import jsonschema

    params = {**params, "max_new_tokens": 160, "json_schema": json.dumps(LIST_SCHEMA)}
    params.pop("ignore_eos")
    plain, spec, stats = run_pair(tiny_engine_factory, PROMPTS, params)
    assert_same(plain, spec)
    assert stats["spec_accepted_tokens_total"] > 0 and stats["jump_forward_tokens_total"] > 0
    for out in spec:
        assert out.meta.finish_reason == "stop"
        jsonschema.validate(json.loads(out.text), LIST_SCHEMA)


def cached_kv(engine, tokens: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    kv = engine.scheduler.kv
    match = kv.cache.match_prefix(tokens)
    assert match.length == len(tokens)
    return (torch.stack([k[match.slots] for k in kv.pool.k_buffers]),
            torch.stack([v[match.slots] for v in kv.pool.v_buffers]))


def test_kv_left_in_the_radix_tree_equals_plain_decodings(tiny_engine_factory):
    plain_engine, spec_engine = tiny_engine_factory(), tiny_engine_factory(**SPEC)
    for prompt in PROMPTS[:3]:
        a, b = plain_engine.generate(prompt, GREEDY), spec_engine.generate(prompt, GREEDY)
        assert a.output_ids == b.output_ids
        tokens = plain_engine.tokenizer.encode(prompt) + a.output_ids[:-1]  # the last token has no KV
        for x, y in zip(cached_kv(plain_engine, tokens), cached_kv(spec_engine, tokens)):
            torch.testing.assert_close(y, x, atol=1e-4, rtol=1e-4)
    assert spec_engine.stats()["spec_accepted_tokens_total"] > 0


def test_bad_speculative_options_are_refused_with_the_field_name(tiny_model_dir):
    for options, field in [({"speculative_algorithm": "EAGLE"}, "speculative_algorithm"),
                           ({"speculative_num_draft_tokens": 0}, "speculative_num_draft_tokens"),
                           ({"speculative_ngram_max_match_window_size": 0}, "speculative_ngram_max_match_window_size"),
                           ({"speculative_ngram_capacity": -1}, "speculative_ngram_capacity")]:
        with pytest.raises(ValueError, match=field):
            EngineConfig.from_options(str(tiny_model_dir), device="cpu", **options)


# ---- step by step, with the memory invariant checked after every step ----------------------------
class Harness:
    def __init__(self, model_dir, **options):
        options.setdefault("kv_cache_tokens", 2048)
        cfg = EngineConfig.from_options(str(model_dir), device="cpu", **options)
        parts = create_scheduler(cfg)
        self.core, self.tokenizer = parts.core, parts.tokenizer
        self.sched = parts.core.scheduler
        self.chunks = defaultdict(list)

    def add(self, rid: str, prompt: str, **params) -> Req:
        sp = parse_params({**GREEDY, **params})
        check_params(sp, self.tokenizer.vocab_size, self.sched.context_length)
        req = create_req(rid, self.tokenizer.encode(prompt), sp, self.tokenizer, self.chunks[rid].append,
                         context_length=self.sched.context_length, seed=0, device=torch.device("cpu"))
        self.sched.add(req)
        return req

    def step(self):
        items = self.core.step()
        self.sched.check_invariants()
        return items

    def run(self) -> None:
        for _ in range(10_000):
            if not self.sched.has_work:
                return
            self.step()
        raise AssertionError("scheduler did not drain")

    def output(self, rid: str) -> list[int]:
        return [t for c in self.chunks[rid] for t in c.token_ids]


class JunkDrafter(ScriptedDrafter):
    """Proposes random trees: nearly every node is rejected."""

    def __init__(self, seed: int):
        self.rng = random.Random(seed)

    def propose_one(self, req: Req, room: int) -> DraftTree:
        n = min(room, self.rng.randint(0, 10))
        return DraftTree([self.rng.randrange(1000) for _ in range(n)], [self.rng.randint(-1, i - 1) for i in range(n)])



@pytest.fixture(scope="module")
def plain_outputs(tiny_model_dir):
    h = Harness(tiny_model_dir, disable_radix_cache=True, kv_cache_tokens=4096)
    for i, p in enumerate(PROMPTS):
        h.add(f"r{i}", p)
    h.run()
    return {f"r{i}": h.output(f"r{i}") for i in range(len(PROMPTS))}


def test_rejected_trees_free_their_slots_every_step(tiny_model_dir, plain_outputs):
    h = Harness(tiny_model_dir, **SPEC)
    h.core.set_drafter(JunkDrafter(0))
    for i, p in enumerate(PROMPTS):
        h.add(f"r{i}", p)
    trees = 0
    while h.sched.has_work:
        trees += sum(item.parents is not None for item in h.step())
    assert trees > 20
    assert {rid: h.output(rid) for rid in plain_outputs} == plain_outputs
    assert h.sched.kv.num_free_slots + h.sched.kv.cached_tokens == h.sched.kv.num_slots


def test_one_step_mixes_tree_items_and_plain_decodes(tiny_model_dir, plain_outputs):
    h = Harness(tiny_model_dir, **SPEC)
    for i, p in enumerate(PROMPTS):
        h.add(f"r{i}", p)
    mixed = 0
    while h.sched.has_work:
        items = h.step()
        kinds = {item.parents is not None for item in items}
        mixed += kinds == {True, False}
    assert mixed > 0
    assert {rid: h.output(rid) for rid in plain_outputs} == plain_outputs


def test_aborts_and_a_failed_step_in_the_middle_of_verifies_leak_nothing(tiny_model_dir):
    h = Harness(tiny_model_dir, **SPEC)
    h.core.set_drafter(JunkDrafter(1))
    reqs = [h.add(f"r{i}", p) for i, p in enumerate(PROMPTS)]
    while not all(r.num_draft for r in reqs[:2]):
        h.step()
    h.sched.abort("r0")  # a draft proposed, its verify not run yet
    h.sched.check_invariants()
    real_forward = h.core.runner.forward

    def failing_forward(batch):
        assert any(item.parents is not None for item in batch.items)
        real_forward(batch)  # the tree's KV is written, then the step fails
        raise RuntimeError("device lost")

    h.core.runner.forward = failing_forward
    h.step()
    h.core.runner.forward = real_forward
    assert all(r.done for r in reqs[:2]) and h.chunks["r1"][-1].finish_reason == "abort"
    h.run()
    assert h.sched.kv.num_free_slots + h.sched.kv.cached_tokens == h.sched.kv.num_slots


def test_preemption_with_drafts_in_flight_keeps_outputs(tiny_model_dir, plain_outputs):
    h = Harness(tiny_model_dir, kv_cache_tokens=160, **SPEC)
    h.core.set_drafter(JunkDrafter(2))
    for i, p in enumerate(PROMPTS):
        h.add(f"r{i}", p)
    h.run()
    assert h.sched.counters.preemptions > 0
    assert {rid: h.output(rid) for rid in plain_outputs} == plain_outputs


def bare_req(tokenizer, rid: str, prompt: str | list[int]) -> Req:
    ids = prompt if isinstance(prompt, list) else tokenizer.encode(prompt)
    return create_req(rid, ids, parse_params(GREEDY), tokenizer, lambda chunk: None,
                      context_length=1024, seed=0, device=torch.device("cpu"))


def test_finished_requests_feed_a_shared_trie_that_drafts_for_later_ones(tokenizer):
    drafter = NgramDrafter(EngineConfig(speculative_algorithm="NGRAM", speculative_ngram_capacity=500))
    head, boilerplate = tokenizer.encode("Letter one."), tokenizer.encode(" Sincerely yours, the radixlang team")
    first = bare_req(tokenizer, "a", head + boilerplate)
    later = bare_req(tokenizer, "b", tokenizer.encode("Letter two.") + boilerplate[:3])
    assert drafter.propose_one(later, 8).tokens == []  # its own text has no continuation of its end
    drafter.forget(first, finished=True)
    expected = boilerplate[3:]  # what followed in the finished request
    tree = drafter.propose_one(later, 8)
    assert tree.tokens == expected[:len(tree.tokens)] and len(tree.tokens) >= 3
    for i in range(30):  # past capacity the shared trie starts over
        drafter.forget(bare_req(tokenizer, f"x{i}", f"Unrelated text number {i} goes here."), finished=True)
    assert drafter.shared.size <= 500 + 14 * 20


def test_short_matches_that_keep_failing_back_off_while_long_ones_keep_drafting(tokenizer):
    drafter = NgramDrafter(EngineConfig(speculative_algorithm="NGRAM", speculative_ngram_capacity=0))
    short = bare_req(tokenizer, "short", [1, 2, 3, 4, 5, 9, 1])  # its end matches one token: "1" -> 2
    long = bare_req(tokenizer, "long", [1, 2, 3, 4, 5, 6, 7, 1, 2, 3])  # "1 2 3" -> 4
    short_drafts = long_drafts = 0
    for _ in range(40):
        tree = drafter.propose_one(short, 8)
        assert tree.tokens in ([], [2, 3, 4, 5, 9][:len(tree.tokens)])
        if tree.tokens:
            short_drafts += 1
            drafter.verified(short, len(tree.tokens), 0)
        tree = drafter.propose_one(long, 8)
        assert tree.tokens[:1] == [4]  # never backed off by the short match's failures
        long_drafts += 1
        drafter.verified(long, len(tree.tokens), 3)
    # the average falls from 2.0 below the break-even (1.5) at once: misses sit out 1, 3, 7, 15 chances
    assert short_drafts == 5
    assert long_drafts == 40
    drafter.forget(short, finished=False)
    drafter.forget(long, finished=False)
    drafter.check([])


def test_flush_cache_forgets_the_shared_trie(tiny_engine_factory):
    engine = tiny_engine_factory(**SPEC)
    engine.generate(PROMPTS[:2], GREEDY)
    shared = engine.scheduler.drafter.shared
    assert shared.size > 0
    assert engine.flush_cache()
    assert shared.size == 0 and shared.match(engine.tokenizer.encode(PROMPTS[0]), 1, 6) is None
    engine.check_invariants()
