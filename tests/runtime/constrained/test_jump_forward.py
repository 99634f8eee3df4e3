"""Jump-forward: canonical drafts, verification that keeps outputs unchanged, KV rollback."""
from __future__ import annotations

import json
import random
import re

import jsonschema
import pytest

from radixlang.runtime.constrained.jump_forward import JumpForwarder

FORCED = ['"name":"', ',"age":', "é and more", "00;\n  y", " quick brown fox", ", 3]", '{"name', "}"]
SCHEMA = {"type": "object", "properties": {
    "first_name": {"type": "string", "maxLength": 5}, "last_name": {"type": "string", "maxLength": 5},
    "status": {"enum": ["active", "inactive", "banned"]}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
}, "required": ["first_name", "last_name", "status", "age"],
    "additionalProperties": False}  # open, the tiny random model's sampled undeclared members run past max_new_tokens


def spelled(tokenizer, ids) -> bytes:
    return b"".join(tokenizer.token_bytes[t] for t in ids)


@pytest.mark.parametrize("forced", FORCED)
def test_draft_is_the_tokenizers_own_split_of_the_forced_text(tokenizer, forced):
    tokens = JumpForwarder(tokenizer).draft(forced.encode())
    assert spelled(tokenizer, tokens) == forced.encode()
    assert tokens == tokenizer.encode(forced, add_special_tokens=False)


def test_draft_never_splits_a_utf8_character(tokenizer):
    jf = JumpForwarder(tokenizer)
    assert spelled(tokenizer, jf.draft("ab é".encode()[:-1])) == b"ab "  # ends inside é
    assert jf.draft("é".encode()[1:]) == []  # starts inside a character


def test_streamed_chunks_rebuild_the_final_output(tiny_engine):
    before = tiny_engine.stats()["jump_forward_tokens_total"]
    for seed in range(4):
        params = {"json_schema": SCHEMA, "max_new_tokens": 80, "temperature": 1.0, "seed": seed}
        ids, text = [], []
        for chunk in tiny_engine.stream(f"person {seed}:", params):
            ids.extend(chunk.token_ids)
            text.append(chunk.text)
        completion = tiny_engine.generate(f"person {seed}:", params)
        assert ids == completion.output_ids and "".join(text) == completion.text
        assert chunk.completion_tokens == len(ids)
        jsonschema.validate(json.loads(completion.text), SCHEMA)
    assert tiny_engine.stats()["jump_forward_tokens_total"] > before
    tiny_engine.check_invariants()


def test_jump_forward_changes_no_output_greedy_seeded_or_penalized(tiny_engine_factory):
    """Drafts are verified by sampling at each drafted position, so outputs equal plain decoding."""
    plain = tiny_engine_factory(disable_jump_forward=True)
    jumping = tiny_engine_factory()
    prompts = ["a", "person:", "the quick brown fox", "x y z"]
    for extra in ({"temperature": 0}, {"temperature": 0.8, "seed": 5, "top_p": 0.9},
                  {"temperature": 0, "frequency_penalty": 1.5, "repetition_penalty": 1.3}):
        params = {**extra, "json_schema": SCHEMA, "max_new_tokens": 80}
        want = plain.generate(prompts, params)
        got = jumping.generate(prompts, params)
        assert [c.output_ids for c in got] == [c.output_ids for c in want]
        assert [c.text for c in got] == [c.text for c in want]
    stats = jumping.stats()
    assert stats["jump_forward_tokens_total"] > 0
    assert stats["jump_forward_drafted_total"] > stats["jump_forward_tokens_total"]  # some drafts were rolled back
    assert plain.stats()["jump_forward_drafted_total"] == 0
    assert stats["generated_tokens_total"] < plain.stats()["generated_tokens_total"]


def test_logprobs_of_jump_forwarded_tokens_match_plain_decoding(tiny_engine_factory):
    plain = tiny_engine_factory(disable_jump_forward=True)
    jumping = tiny_engine_factory()
    params = {"json_schema": SCHEMA, "max_new_tokens": 60, "temperature": 0}
    a = plain.generate("p", params, return_logprob=True, top_logprobs_num=2)
    b = jumping.generate("p", params, return_logprob=True, top_logprobs_num=2)
    assert a.output_ids == b.output_ids and jumping.stats()["jump_forward_tokens_total"] > 0
    assert len(b.meta.output_logprobs) == len(b.output_ids)
    for x, y in zip(a.meta.output_logprobs, b.meta.output_logprobs):
        assert x.token_id == y.token_id and abs(x.logprob - y.logprob) < 1e-3


def test_jump_forward_respects_max_new_tokens(tiny_engine):
    pattern = "x" + "abcdefgh" * 8
    for limit in (1, 2, 5):
        c = tiny_engine.generate("p", {"regex": pattern, "max_new_tokens": limit, "temperature": 0})
        assert c.meta.finish_reason == "length" and len(c.output_ids) == limit and pattern.startswith(c.text)
    tiny_engine.check_invariants()


def test_a_stop_string_inside_forced_text_stops_there(tiny_engine):
    c = tiny_engine.generate("p", {"regex": "(a|b) then STOP and more words", "stop": ["STOP"],
                                   "max_new_tokens": 30, "temperature": 0})
    assert c.meta.finish_reason == "stop" and c.meta.matched_stop == "STOP"
    assert re.fullmatch("(a|b) then ", c.text)
    tiny_engine.check_invariants()


def test_drafts_survive_tight_prefill_budgets_and_preemption(tiny_engine_factory):
    params = {"json_schema": SCHEMA, "max_new_tokens": 80, "temperature": 0}
    prompts = [f"request {i}: " + "word " * (i % 4) for i in range(6)]
    want = [c.output_ids for c in tiny_engine_factory(disable_jump_forward=True).generate(prompts, params)]
    for options in ({"max_prefill_tokens": 3}, {"kv_cache_tokens": 170, "init_new_token_ratio": 0.02,
                                                "min_new_token_ratio": 0.0, "preemption_mode": "swap"}):
        engine = tiny_engine_factory(**options)
        assert [c.output_ids for c in engine.generate(prompts, params)] == want
        engine.check_invariants()


def test_rolling_back_into_tree_owned_kv_relocks_the_shallower_node(tiny_engine):
    """Drive the scheduler by hand: after a prefill (tree-owned prompt), forget the last positions,
    check the KV invariant, then finish and compare with an untouched run."""
    prompt = "the same prompt for both runs " * 3
    params = {"max_new_tokens": 6, "temperature": 0}
    reference = tiny_engine.generate(prompt, params).output_ids
    sched = tiny_engine.scheduler
    sub = tiny_engine.prepare(prompt, params, rid="relock-test").requests[0]

    def scenario() -> list[int]:
        sched.flush()  # forget the reference run, so all is prefilled
        req = tiny_engine._make_req(sub, lambda chunk: None)
        sched.add(req)
        tiny_engine.core.step()  # prefill: the prompt becomes tree-owned (cached_len == kv_len)
        assert req.cached_len == req.kv_len == len(req.prompt_ids)
        cut = req.kv_len - 4
        sched.kv.truncate(req, cut)
        assert req.cached_len == cut == req.kv_len
        sched.check_invariants()
        while not req.done:
            tiny_engine.core.step()
        sched.check_invariants()
        return req.output_ids

    assert tiny_engine._thread.call(scenario).result() == reference
    tiny_engine.check_invariants()


def test_jump_forward_with_random_schemas_always_validates(tiny_engine):
    rng = random.Random(0)
    for _ in range(6):
        props = {f"k{i}_{rng.randint(0, 99)}": rng.choice([
            {"type": "boolean"}, {"enum": ["alpha beta", "gamma"]}, {"type": "integer", "minimum": -9, "maximum": 9},
            {"type": "string", "maxLength": 3}, {"type": "array", "items": {"type": "null"}, "maxItems": 2}])
            for i in range(rng.randint(1, 4))}
        schema = {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}
        c = tiny_engine.generate("x", {"json_schema": schema, "max_new_tokens": 100, "temperature": 0.5,
                                       "seed": rng.randint(0, 99)})
        assert c.meta.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), schema)
    tiny_engine.check_invariants()
