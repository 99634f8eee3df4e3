"""Scheduler scenarios on the tiny model, driven step by step with the memory invariant checked after
every step. The oracle for each scenario is the same requests run alone on a roomy engine."""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field

import pytest
import torch

from radixlang.runtime.config import EngineConfig
from radixlang.runtime.engine import create_req, create_scheduler
from radixlang.runtime.execution.engine_core import EngineCore
from radixlang.runtime.request import Req, ReqState, StreamChunk
from radixlang.runtime.scheduling.scheduler import Scheduler
from radixlang.runtime.submission import Retention
from radixlang.runtime.validation import check_params, parse_params

GREEDY = {"temperature": 0, "ignore_eos": True}


@dataclass
class Harness:
    core: EngineCore
    tokenizer: object
    chunks: dict[str, list[StreamChunk]] = field(default_factory=lambda: defaultdict(list))

    @property
    def sched(self) -> Scheduler:
        return self.core.scheduler

    def request(self, rid: str, prompt: str | list[int], **params) -> Req:
        ids = prompt if isinstance(prompt, list) else self.tokenizer.encode(prompt)
        sp = parse_params({**GREEDY, **params})
        check_params(sp, self.tokenizer.vocab_size, self.sched.context_length)
        return create_req(rid, ids, sp, self.tokenizer, self.chunks[rid].append,
                          context_length=self.sched.context_length, seed=0, device=torch.device("cpu"))

    def add(self, *reqs: Req) -> None:
        for r in reqs:
            self.sched.add(r)

    def step(self):
        chunks = self.core.step()
        self.sched.check_invariants()
        return chunks

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_work:
                return
            self.step()
        raise AssertionError("scheduler did not drain")

    def output_ids(self, rid: str) -> list[int]:
        return [t for c in self.chunks[rid] for t in c.token_ids]

    def final(self, rid: str) -> StreamChunk:
        assert self.chunks[rid] and self.chunks[rid][-1].finished
        return self.chunks[rid][-1]


@pytest.fixture
def harness(tiny_model_dir, tokenizer):
    def make(**options) -> Harness:
        options.setdefault("kv_cache_tokens", 2048)
        cfg = EngineConfig.from_options(str(tiny_model_dir), device="cpu", **options)
        parts = create_scheduler(cfg)
        return Harness(parts.core, parts.tokenizer)
    return make


PROMPTS = [
    "The history of the printing press",
    "1, 2, 3, 4, 5,",
    "Dear hiring manager, I am writing to apply for",
    "In mathematics, a prime number is",
]


@pytest.fixture(scope="module")
def solo_outputs(tiny_model_dir):
    """Each prompt run alone, with plenty of KV and no cache: the oracle."""
    cfg = EngineConfig.from_options(str(tiny_model_dir), device="cpu", kv_cache_tokens=4096,
                                    disable_radix_cache=True)
    parts = create_scheduler(cfg)
    h = Harness(parts.core, parts.tokenizer)
    out = {}
    for i, p in enumerate(PROMPTS):
        h.add(h.request(f"solo{i}", p, max_new_tokens=24))
        h.run()
        out[p] = h.output_ids(f"solo{i}")
    return out


def test_prefill_joins_running_decodes_in_one_step(harness):
    h = harness()
    h.add(h.request("a", PROMPTS[0], max_new_tokens=8))
    h.step()  # prefill of a
    h.step()  # a decodes
    h.add(h.request("b", PROMPTS[1], max_new_tokens=8))
    chunks = h.step()
    kinds = {c.req.rid: c.length for c in chunks}
    assert kinds["a"] == 1 and kinds["b"] == len(h.tokenizer.encode(PROMPTS[1]))


def test_continuous_batching_gives_solo_outputs(harness, solo_outputs):
    h = harness()
    for i, p in enumerate(PROMPTS):  # staggered arrivals
        h.add(h.request(f"r{i}", p, max_new_tokens=24))
        h.step()
    h.run()
    for i, p in enumerate(PROMPTS):
        assert h.output_ids(f"r{i}") == solo_outputs[p]


def test_chunked_prefill_respects_budget_and_matches_solo(harness, solo_outputs):
    h = harness(max_prefill_tokens=3)
    prompt = PROMPTS[2]
    h.add(h.request("c", prompt, max_new_tokens=24))
    n = len(h.tokenizer.encode(prompt))
    prefill_steps = 0
    while not h.output_ids("c"):
        chunks = h.step()
        assert sum(c.length for c in chunks) <= 3
        prefill_steps += 1
    assert prefill_steps == -(-n // 3)
    h.run()
    assert h.output_ids("c") == solo_outputs[prompt]


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_preemption_when_kv_runs_out_keeps_greedy_output(harness, solo_outputs, mode):
    h = harness(kv_cache_tokens=64, preemption_mode=mode, init_new_token_ratio=0.0, min_new_token_ratio=0.0)
    for i, p in enumerate(PROMPTS):
        h.add(h.request(f"r{i}", p, max_new_tokens=24))
    h.run()
    assert h.sched.stats()["preemptions_total"] > 0
    for i, p in enumerate(PROMPTS):
        assert h.output_ids(f"r{i}") == solo_outputs[p]
        assert h.final(f"r{i}").finish_reason == "length"


def test_swap_preemption_restores_kv_without_recompute(harness):
    h = harness(kv_cache_tokens=64, preemption_mode="swap", disable_radix_cache=True,
                init_new_token_ratio=0.0, min_new_token_ratio=0.0)
    for i, p in enumerate(PROMPTS):
        h.add(h.request(f"r{i}", p, max_new_tokens=24))
    swapped_back, preempted = 0, set()
    while h.sched.has_work:
        preempted |= {r.rid for r in h.sched.waiting if r.state is ReqState.PREEMPTED}
        for c in h.step():
            # a swapped-in request resumes with a single-token step: its KV came back from host memory
            if c.req.rid in preempted and c.start > len(c.req.prompt_ids):
                assert c.length == 1
                swapped_back += 1
    assert swapped_back > 0


@pytest.mark.parametrize("mode", ["recompute", "swap"])
def test_a_background_request_preempted_for_a_session_turn_keeps_its_greedy_output(harness, solo_outputs, mode):
    h = harness(kv_cache_tokens=64, preemption_mode=mode, init_new_token_ratio=0.0, min_new_token_ratio=0.0)
    h.add(h.request("bg", PROMPTS[0], max_new_tokens=24))
    for _ in range(4):
        h.step()  # bg prefilled and decoding
    turn = h.request("turn", " ".join(PROMPTS[1:] * 2), max_new_tokens=4)  # fits only in bg's slots
    turn.retain = Retention.session("agent")
    h.add(turn)
    first = h.step()
    assert [c.req.rid for c in first] == ["turn"]  # admitted at once, not after bg's 20 remaining decodes
    assert h.sched.stats()["priority_preemptions_total"] == 1
    h.run()
    assert h.output_ids("bg") == solo_outputs[PROMPTS[0]]
    assert h.final("bg").finish_reason == "length" and h.final("turn").finish_reason == "length"


def test_request_larger_than_pool_finishes_with_length_instead_of_spinning(harness):
    h = harness(kv_cache_tokens=24)
    h.add(h.request("big", PROMPTS[0], max_new_tokens=100))
    h.run()
    final = h.final("big")
    assert final.finish_reason == "length"
    assert len(h.tokenizer.encode(PROMPTS[0])) + final.completion_tokens <= 25


def test_abort_waiting_and_running_requests_frees_everything(harness):
    h = harness(max_running_requests=1)
    h.add(h.request("run", PROMPTS[0], max_new_tokens=50), h.request("wait", PROMPTS[1], max_new_tokens=50))
    h.step()
    h.step()
    assert h.sched.reqs["run"].state is ReqState.RUNNING and h.sched.reqs["wait"].state is ReqState.WAITING
    assert h.sched.abort("wait") and h.sched.abort("run")
    h.sched.check_invariants()
    assert h.final("run").finish_reason == "abort" and h.final("wait").finish_reason == "abort"
    assert not h.sched.has_work and not h.sched.abort("run")
    # the aborted request's computed prefix went to the cache
    assert h.sched.kv.cache.total_size > 0


def test_radix_cache_reuses_prefix_and_changes_nothing(harness, solo_outputs):
    h = harness()
    shared = "Shared instructions: answer briefly and precisely. Question: "
    h.add(h.request("warm", shared + "why?", max_new_tokens=4))
    h.run()
    for i, p in enumerate(PROMPTS):
        h.add(h.request(f"q{i}", shared + p, max_new_tokens=12))
    h.run()
    off = harness(disable_radix_cache=True)
    for i, p in enumerate(PROMPTS):
        off.add(off.request(f"q{i}", shared + p, max_new_tokens=12))
    off.run()
    shared_len = len(h.tokenizer.encode(shared))
    for i in range(len(PROMPTS)):
        assert h.final(f"q{i}").cached_tokens >= shared_len - 1
        assert off.final(f"q{i}").cached_tokens == 0
        assert h.output_ids(f"q{i}") == off.output_ids(f"q{i}")


def test_prompt_logprobs_are_exact_even_when_prefix_is_cached(harness):
    h = harness()
    prompt = PROMPTS[3]
    h.add(h.request("warm", prompt, max_new_tokens=1))
    h.run()
    req = h.request("lp", prompt, max_new_tokens=1)
    req.return_logprob, req.logprob_start_len = True, 2
    h.add(req)
    h.run()
    got = h.chunks["lp"][0].input_logprobs
    off = harness(disable_radix_cache=True)
    ref = off.request("lp", prompt, max_new_tokens=1)
    ref.return_logprob, ref.logprob_start_len = True, 2
    off.add(ref)
    off.run()
    want = off.chunks["lp"][0].input_logprobs
    n = len(h.tokenizer.encode(prompt))
    assert len(got) == len(want) == n - 2
    assert [g.token_id for g in got] == h.tokenizer.encode(prompt)[2:]
    assert all(abs(g.logprob - w.logprob) < 1e-5 for g, w in zip(got, want))


def cached_prefix_harness(harness, policy: str) -> Harness:
    h = harness(schedule_policy=policy, max_running_requests=1)
    h.add(h.request("warm", "alpha beta gamma delta epsilon zeta", max_new_tokens=1))
    h.run()
    return h


def admitted_order(h: Harness) -> list[str]:
    order = []
    while h.sched.has_work:
        for c in h.step():
            if c.req.rid not in order:
                order.append(c.req.rid)
    return order


def test_lpm_admits_longest_cached_prefix_first(harness):
    h = cached_prefix_harness(harness, "lpm")
    h.add(h.request("cold", "totally unrelated text here", max_new_tokens=2),
          h.request("hot", "alpha beta gamma delta epsilon zeta eta", max_new_tokens=2))
    assert admitted_order(h) == ["hot", "cold"]


def test_fcfs_admits_in_arrival_order(harness):
    h = cached_prefix_harness(harness, "fcfs")
    h.add(h.request("cold", "totally unrelated text here", max_new_tokens=2),
          h.request("hot", "alpha beta gamma delta epsilon zeta eta", max_new_tokens=2))
    assert admitted_order(h) == ["cold", "hot"]


def test_dfs_weight_runs_requests_sharing_a_subtree_back_to_back(harness):
    h = harness(schedule_policy="dfs-weight")
    h.add(h.request("w1", "one two three four", max_new_tokens=1),
          h.request("w2", "nine eight seven six", max_new_tokens=1))
    h.run()
    h.add(h.request("a1", "nine eight seven six five", max_new_tokens=1),
          h.request("b1", "one two three four five", max_new_tokens=1),
          h.request("a2", "nine eight seven six four", max_new_tokens=1),
          h.request("b2", "one two three four six", max_new_tokens=1),
          h.request("a3", "nine eight seven six three", max_new_tokens=1))
    admitted = [c.req.rid for c in h.step()]
    assert admitted == ["a1", "a2", "a3", "b1", "b2"]  # heavier subtree first, each group together
    h.run()


def test_max_running_requests_caps_the_batch(harness):
    h = harness(max_running_requests=2)
    h.add(*(h.request(f"r{i}", p, max_new_tokens=5) for i, p in enumerate(PROMPTS)))
    while h.sched.has_work:
        h.step()
        assert len(h.sched.running) <= 2


def test_prefill_only_request_caches_prompt(harness):
    h = harness()
    h.add(h.request("p", PROMPTS[0], max_new_tokens=0))
    h.run()
    assert h.final("p").finish_reason == "length" and h.final("p").completion_tokens == 0
    n = len(h.tokenizer.encode(PROMPTS[0]))
    assert h.sched.kv.cache.match_prefix(h.tokenizer.encode(PROMPTS[0])).length == n


def test_failed_step_aborts_its_requests_and_engine_continues(harness, monkeypatch):
    h = harness()
    h.add(h.request("doomed", PROMPTS[0], max_new_tokens=5))
    real = h.core.runner.forward
    monkeypatch.setattr(h.core.runner, "forward", lambda chunks: (_ for _ in ()).throw(RuntimeError("boom")))
    h.step()
    assert h.final("doomed").finish_reason == "abort" and "boom" in h.final("doomed").error
    monkeypatch.setattr(h.core.runner, "forward", real)
    h.add(h.request("fine", PROMPTS[0], max_new_tokens=5))
    h.run()
    assert h.final("fine").finish_reason == "length"


def test_identical_prompts_prefilled_together_leave_one_cached_copy(harness):
    h = harness()
    h.add(h.request("x", PROMPTS[0], max_new_tokens=6), h.request("y", PROMPTS[0], max_new_tokens=6))
    chunks = h.step()
    assert [c.req.cached_len for c in chunks] == [c.end for c in chunks]  # both handed to the tree
    h.run()
    assert h.output_ids("x") == h.output_ids("y")
    n = len(h.tokenizer.encode(PROMPTS[0]))
    assert h.sched.kv.cache.total_size == n + 5  # one copy of prompt + the generated tokens with KV


def test_prompts_sharing_a_long_uncached_prefix_are_staggered_to_reuse_it(harness):
    h = harness()
    shared = " ".join(f"word{i}" for i in range(40))
    assert len(h.tokenizer.encode(shared)) >= 32
    h.add(*(h.request(f"s{i}", shared + f" question {i}", max_new_tokens=2) for i in range(3)))
    first = h.step()
    assert [c.req.rid for c in first] == ["s0"]  # the others wait one step for the cached prefix
    h.run()
    assert all(h.final(f"s{i}").cached_tokens >= len(h.tokenizer.encode(shared)) - 1 for i in (1, 2))
