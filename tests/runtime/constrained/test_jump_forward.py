"""Jump-forward: canonical re-tokenization at the boundary, KV rollback, stream consistency."""
from __future__ import annotations

import json
import random
import re

import pytest

from radixlang.runtime.constrained.jump_forward import JumpForwarder

CASES = [
    ('{"name":"John"', ',"age":'), ('{"name":"John', '","age":'), ('{"', 'name":"'), ("", '{"name":"'),
    ("abc é", "é and more"), ("x = 1", "00;\n  y"), ("The", " quick brown fox"), ("[1, 2", ", 3]"),
]


def token_text(tokenizer, ids) -> bytes:
    return b"".join(tokenizer.token_bytes[i] for i in ids)


@pytest.mark.parametrize("before, forced", CASES)
def test_plan_appends_canonical_tokens_for_a_prefix_of_the_forced_text(tokenizer, before, forced):
    jf = JumpForwarder(tokenizer)
    ids = tokenizer.encode(before) if before else []
    plan = jf.plan(ids, lambda t: tokenizer.token_bytes[t], forced.encode(), final=False)
    assert plan is not None
    keep = len(ids) - plan.rollback
    new_bytes = token_text(tokenizer, ids[:keep] + plan.tokens)
    target = (before + forced).encode()
    assert target.startswith(new_bytes) and len(new_bytes) > len(before.encode())
    appended = token_text(tokenizer, plan.tokens).decode()
    assert plan.tokens == tokenizer.encode(appended, add_special_tokens=False)  # canonical on its own
    rest = target[len(new_bytes):].decode()
    assert rest, "the last pre-token is kept back for the model"
    assert tokenizer.encode(appended + rest, add_special_tokens=False)[: len(plan.tokens)] == plan.tokens


def test_plan_rolls_back_into_the_pre_token_that_holds_the_junction(tokenizer):
    jf = JumpForwarder(tokenizer)
    ids = tokenizer.encode('{"name":"John"')
    plan = jf.plan(ids, lambda t: tokenizer.token_bytes[t], b',"age":', final=False)
    assert plan.rollback == 1  # the closing quote merges with the comma
    assert [tokenizer.decode([t]) for t in plan.tokens] == ['","', "age"]


def test_final_plan_appends_everything(tokenizer):
    jf = JumpForwarder(tokenizer)
    ids = tokenizer.encode('{"a":1')
    plan = jf.plan(ids, lambda t: tokenizer.token_bytes[t], b"}", final=True)
    assert token_text(tokenizer, plan.tokens).endswith(b"}")


def test_plan_never_splits_a_utf8_character(tokenizer):
    jf = JumpForwarder(tokenizer)
    forced = "ab é".encode()[:-1]  # ends inside é
    plan = jf.plan(tokenizer.encode("x"), lambda t: tokenizer.token_bytes[t], forced, final=True)
    assert plan is not None and token_text(tokenizer, plan.tokens).decode().endswith("ab ")


def replay_stream(engine, prompt, params):
    ids, text, last = [], [], None
    for chunk in engine.stream(prompt, params):
        if chunk.rollback:
            del ids[-chunk.rollback:]
        ids.extend(chunk.token_ids)
        text.append(chunk.text)
        last = chunk
    return ids, "".join(text), last


SCHEMA = {"type": "object", "properties": {
    "first_name": {"type": "string", "maxLength": 5}, "last_name": {"type": "string", "maxLength": 5},
    "status": {"enum": ["active", "inactive", "banned"]}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
}, "required": ["first_name", "last_name", "status", "age"]}


def test_streamed_ids_with_rollbacks_rebuild_the_final_output(tiny_engine):
    before = tiny_engine.stats()["jump_forward_tokens_total"]
    for seed in range(4):
        params = {"json_schema": SCHEMA, "max_new_tokens": 80, "temperature": 1.0, "seed": seed}
        ids, text, last = replay_stream(tiny_engine, f"person {seed}:", params)
        completion = tiny_engine.generate(f"person {seed}:", params)
        assert ids == completion.output_ids and text == completion.text
        assert text == tiny_engine.tokenizer.decode(ids)
        assert last.completion_tokens == len(ids)
        json.loads(text)
    assert tiny_engine.stats()["jump_forward_tokens_total"] > before
    tiny_engine.check_invariants()


def test_disabling_jump_forward_decodes_every_token(tiny_engine_factory):
    engine = tiny_engine_factory(disable_jump_forward=True)
    c = engine.generate("p", {"json_schema": SCHEMA, "max_new_tokens": 80, "temperature": 0})
    json.loads(c.text)
    assert engine.stats()["jump_forward_tokens_total"] == 0
    assert engine.stats()["generated_tokens_total"] == len(c.output_ids)


def test_jump_forward_respects_max_new_tokens(tiny_engine):
    c = tiny_engine.generate("p", {"regex": "x" + "abcdefgh" * 8, "max_new_tokens": 5, "temperature": 0})
    assert c.meta.finish_reason == "length" and len(c.output_ids) == 5
    assert ("x" + "abcdefgh" * 8).startswith(c.text)
    tiny_engine.check_invariants()


def test_a_stop_string_inside_forced_text_stops_there(tiny_engine):
    c = tiny_engine.generate("p", {"regex": "(a|b) then STOP and more words", "stop": ["STOP"],
                                   "max_new_tokens": 30, "temperature": 0})
    assert c.meta.finish_reason == "stop" and c.meta.matched_stop == "STOP"
    assert re.fullmatch("(a|b) then ", c.text)
    tiny_engine.check_invariants()


def test_penalties_are_recounted_after_a_jump(tiny_engine):
    params = {"json_schema": SCHEMA, "max_new_tokens": 80, "temperature": 0, "frequency_penalty": 1.5,
              "repetition_penalty": 1.3}
    for c in tiny_engine.generate(["a", "b"], params):
        json.loads(c.text)
    tiny_engine.check_invariants()


def test_rolling_back_into_tree_owned_kv_relocks_the_shallower_node(tiny_engine):
    """Drive the scheduler by hand: after a prefill (tree-owned prompt), forget the last positions
    and check the KV invariant, then finish and compare with an untouched run."""
    prompt = "the same prompt for both runs " * 3
    params = {"max_new_tokens": 6, "temperature": 0}
    reference = tiny_engine.generate(prompt, params).output_ids
    sched = tiny_engine.scheduler
    sub = tiny_engine._submissions(prompt, params, None, False, -1, 0, "relock-test")[0][0]
    chunks = []

    def scenario():
        sched.cache.evict(sched.cache.evictable_size)  # forget the reference run, so all is prefilled
        req = tiny_engine._make_req(sub, chunks.append)
        sched.add(req)
        sched.step()  # prefill: the prompt becomes tree-owned (cached_len == kv_len)
        assert req.cached_len == req.kv_len == len(req.prompt_ids)
        cut = req.kv_len - 4
        sched._truncate_kv(req, cut)
        assert req.cached_len == cut == req.kv_len
        sched.check_invariants()
        while not req.done:
            sched.step()
        sched.check_invariants()
        return req.output_ids

    assert tiny_engine._call(scenario).result() == reference
    tiny_engine.check_invariants()


def test_jump_forward_with_random_schemas_always_validates(tiny_engine):
    import jsonschema

    rng = random.Random(0)
    for _ in range(6):
        props = {f"k{i}_{rng.randint(0, 99)}": rng.choice([
            {"type": "boolean"}, {"enum": ["alpha beta", "gamma"]}, {"type": "integer", "minimum": -9, "maximum": 9},
            {"type": "string", "maxLength": 3}, {"type": "array", "items": {"type": "null"}, "maxItems": 2}])
            for i in range(rng.randint(1, 4))}
        schema = {"type": "object", "properties": props, "required": list(props)}
        c = tiny_engine.generate("x", {"json_schema": schema, "max_new_tokens": 100, "temperature": 0.5,
                                       "seed": rng.randint(0, 99)})
        assert c.meta.finish_reason == "stop"
        jsonschema.validate(json.loads(c.text), schema)
    tiny_engine.check_invariants()
