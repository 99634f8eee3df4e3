"""Structural tags: free text until a trigger, then a tag whose JSON body is valid for its schema (checked
with `jsonschema`, the oracle), then free again; markers are forced (jump-forward drafts them)."""
from __future__ import annotations

import json
import random

import pytest

from radixlang.runtime.constrained.structural_tag import parse_structural_tag, split_tagged

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the oracle for the tagged parts")

POINT = {"type": "object", "properties": {"x": {"type": "integer", "minimum": -5, "maximum": 5},
                                          "label": {"type": "string", "maxLength": 4}},
         "required": ["x", "label"], "additionalProperties": False}
FLAG = {"type": "object", "properties": {"on": {"type": "boolean"}}, "required": ["on"], "additionalProperties": False}
TREE = {"$defs": {"node": {"type": "object", "properties": {"kids": {"type": "array", "items": {"$ref": "#/$defs/node"},
                                                                     "maxItems": 2}},
                           "required": ["kids"], "additionalProperties": False}}, "$ref": "#/$defs/node"}
LEGACY = {"type": "structural_tag", "triggers": ["<f="],
          "structures": [{"begin": "<f=point>", "schema": POINT, "end": "</f>"},
                         {"begin": "<f=flag>", "schema": FLAG, "end": "</f>"}]}
RECURSIVE = {"type": "structural_tag", "format": {"type": "triggered_tags", "triggers": ["<t>"], "tags": [
    {"type": "tag", "begin": "<t>", "content": {"type": "json_schema", "json_schema": TREE}, "end": "</t>"}]}}
SEPARATED = {"type": "structural_tag", "format": {"type": "tags_with_separator", "separator": ";", "at_least_one": True,
                                                  "tags": [{"begin": "<f=flag>", "content": {"type": "json_schema",
                                                            "json_schema": FLAG}, "end": "</f>"}]}}


def tagged_walk(constraint, trigger: bytes, rng: random.Random, max_tokens: int = 120) -> tuple[bytes, bool]:
    """A random walk that types the trigger now and then (free text seldom spells it by chance)."""
    state, out = constraint.initial(), bytearray()
    vocab = constraint.vocab
    for _ in range(max_tokens):
        allowed = constraint.allowed(state)
        if constraint.can_end(state) and (rng.random() < 0.1 or not allowed.any()):
            return bytes(out), True
        if rng.random() < 0.2 and (nxt := constraint.advance_bytes(state, trigger)) is not None:
            state, out = nxt, out + trigger
            continue
        ids = vocab.ids[allowed[vocab.ids] & (vocab.lengths <= 2)]
        ids = ids if ids.size and rng.random() < 0.8 else vocab.ids[allowed[vocab.ids]]
        token = int(ids[rng.randrange(ids.size)])
        state = constraint.advance(state, token)
        assert state is not None, f"the mask allowed token {token} that advance rejects"
        out += vocab.bytes_of(token)
    return bytes(out), False


def check_parts(text: str, spec: dict, triggers: list[str]) -> int:
    """Every tagged part validates against its tag's schema; free parts hold no trigger. Returns the
    number of tags."""
    tag = parse_structural_tag(spec)
    tags = 0
    for index, part in split_tagged(text, tag):
        if index is None:
            assert not any(t in part for t in triggers), f"a trigger in free text {part!r}"
        else:
            jsonschema.validate(json.loads(part), tag.tags[index].schema)
            tags += 1
    return tags


@pytest.mark.parametrize("spec, trigger", [(LEGACY, "<f="), (RECURSIVE, "<t>")])
def test_every_tagged_part_of_random_outputs_validates(compiler, spec, trigger):
    constraint = compiler.compile("structural_tag", spec)
    rng = random.Random(0)
    tags = 0
    for _ in range(25):
        data, complete = tagged_walk(constraint, trigger.encode(), rng)
        if complete:
            tags += check_parts(data.decode(), spec, [trigger])
    assert tags >= 5  # the walks did reach the constrained parts


def test_separator_mode_is_tags_only(compiler):
    constraint = compiler.compile("structural_tag", SEPARATED)
    state = constraint.initial()
    assert not constraint.can_end(state)  # at_least_one
    assert constraint.forced_bytes(state, 64) == b'<f=flag>{"on":'
    assert constraint.advance_bytes(state, b"hi") is None
    done = constraint.advance_bytes(state, b'<f=flag>{"on":true}</f>;<f=flag>{"on":false}</f>')
    assert done is not None and constraint.can_end(done)


def test_markers_and_keys_are_forced_for_jump_forward(compiler):
    constraint = compiler.compile("structural_tag", LEGACY)
    state = constraint.advance_bytes(constraint.initial(), b"some text <f=")
    assert constraint.forced_bytes(state, 64) == b""  # point or flag: the model chooses
    state = constraint.advance_bytes(state, b"p")
    assert constraint.forced_bytes(state, 64) == b'oint>{"x":'
    state = constraint.advance_bytes(state, b'oint>{"x":3')
    assert constraint.forced_bytes(state, 64) == b',"label":"'
    end = constraint.advance_bytes(state, b',"label":"ab"}')
    assert constraint.forced_bytes(end, 64) == b"</f>"
    after = constraint.advance_bytes(end, b"</f> free again")
    assert after is not None and constraint.can_end(after)
    assert constraint.advance_bytes(constraint.initial(), b'<f=point>{"x":9,') is None  # out of the schema's range


def test_stop_after_first_ends_after_one_tag(compiler):
    spec = {"type": "structural_tag", "format": {**SEPARATED["format"], "stop_after_first": True}}
    constraint = compiler.compile("structural_tag", spec)
    done = constraint.advance_bytes(constraint.initial(), b'<f=flag>{"on":true}</f>')
    assert constraint.can_end(done) and not constraint.allowed(done).any()


@pytest.mark.parametrize("spec, words", [
    ({"type": "structural_tag", "structures": [], "triggers": ["<"]}, "at least one tag"),
    ({"type": "structural_tag", "structures": [{"begin": "<a>", "schema": FLAG, "end": ""}], "triggers": ["["]},
     "starts with none of the triggers"),
    ({"type": "structural_tag", "structures": [{"begin": "<a>", "schema": FLAG}], "triggers": ["<"], "x": 1},
     "unknown field"),
    ({"type": "structural_tag", "structures": [{"begin": "<a>", "schema": {"type": "string", "pattern": "(a"},
                                                "end": ""}], "triggers": ["<"]}, "tag 0 ('<a>')"),
    ({"type": "structural_tag", "format": {"type": "or"}}, "format.type"),
])
def test_bad_structural_tags_raise_value_errors_naming_the_field(compiler, spec, words):
    with pytest.raises(ValueError, match="structural_tag") as info:
        compiler.compile("structural_tag", spec)
    assert words in str(info.value)


def test_the_engine_generates_valid_tagged_output(tiny_engine):
    once = {"type": "structural_tag", "format": {**SEPARATED["format"], "stop_after_first": True}}
    drafted = tiny_engine.stats()["jump_forward_tokens_total"]
    outputs = tiny_engine.generate(["Call: ", "Go"], {"structural_tag": once, "max_new_tokens": 60, "temperature": 1.0})
    for out in outputs:
        assert out.meta.finish_reason == "stop"
        assert check_parts(out.text, once, []) == 1
    assert tiny_engine.stats()["jump_forward_tokens_total"] > drafted  # the marker and key came as drafts
    tiny_engine.check_invariants()


@pytest.mark.parametrize("spec, trigger", [(LEGACY, "<f="), (SEPARATED, "<f=flag>")])
def test_the_glued_automaton_speaks_the_same_language_as_the_joint_one(compiler, vocab, spec, trigger):
    """The fast path (parts glued, no joint determinization) against the general one, both ways."""
    from radixlang.runtime.constrained.matcher import RegexConstraint
    from radixlang.runtime.constrained.regex.automaton import compile_dfa
    from radixlang.runtime.constrained.structural_tag import structural_tag_grammar
    from radixlang.runtime.constrained.tag_dispatch import TagDispatch

    tag = parse_structural_tag(spec)
    fast = compiler.compile("structural_tag", spec)
    assert isinstance(fast, TagDispatch)
    joint = RegexConstraint(compile_dfa([structural_tag_grammar(tag).root]), vocab)
    rng = random.Random(3)
    for _ in range(20):
        for walked, other in ((fast, joint), (joint, fast)):
            data, complete = tagged_walk(walked, trigger.encode(), rng, max_tokens=80)
            state = other.advance_bytes(other.initial(), data)
            assert state is not None and (not complete or other.can_end(state)), data


def test_a_tag_is_built_only_when_decoding_reaches_it(compiler, monkeypatch):
    """Ten tools: compiling and the first masks build none of their automata; reaching one tool's
    begin builds that one, and the walk through it is what the joint automaton allows."""
    monkeypatch.setattr(compiler, "precompute_s", 0)  # warming (warming.py) would build the tools it reaches
    from radixlang.runtime.constrained.matcher import RegexConstraint
    from radixlang.runtime.constrained.regex.automaton import compile_dfa
    from radixlang.runtime.constrained.structural_tag import structural_tag_grammar

    tools = [{"begin": f'<t>{{"name": "tool{i}", "arguments": ', "end": "}</t>",
              "schema": {**POINT, "properties": {**POINT["properties"], f"k{i}": {"type": "integer"}}}}
             for i in range(10)]
    spec = {"type": "structural_tag", "triggers": ["<t>"], "structures": tools}
    lazy = compiler.compile("structural_tag", spec)
    assert lazy.unbuilt.sum() == 10
    state = lazy.advance_bytes(lazy.initial(), b'Sure. <t>{"name": "tool')
    assert lazy.allowed(state).any() and lazy.unbuilt.sum() == 10
    state = lazy.advance_bytes(state, b'3", "arguments": ')
    assert lazy.forced_bytes(state, 64) == b'{"x":' and lazy.unbuilt.sum() == 9
    joint = RegexConstraint(compile_dfa([structural_tag_grammar(parse_structural_tag(spec)).root]), lazy.vocab)
    rng = random.Random(5)
    for _ in range(10):
        data, complete = tagged_walk(lazy, b'<t>{"name": "tool3", "arguments": ', rng, max_tokens=60)
        other = joint.advance_bytes(joint.initial(), data)
        assert other is not None and (not complete or joint.can_end(other)), data
    assert lazy.unbuilt.sum() == 9  # the walks only ever called tool 3


def test_a_bad_schema_is_refused_up_front_though_built_lazily(compiler):
    bad = {"type": "object", "properties": {"a": {"type": "string", "pattern": "(a"}}}
    spec = {"type": "structural_tag", "triggers": ["<t>"], "structures": [
        {"begin": "<t>ok", "schema": POINT, "end": "</t>"}, {"begin": "<t>bad", "schema": bad, "end": "</t>"}]}
    with pytest.raises(ValueError, match=r"tag 1 \('<t>bad'\)"):
        compiler.compile("structural_tag", spec)


def test_property_order_is_part_of_the_cache_key(compiler):
    """Two schemas that differ only in property order are two languages (members come in order)."""
    swapped = {**POINT, "properties": dict(reversed(POINT["properties"].items()))}
    for schema, first in ((POINT, b'{"x":'), (swapped, b'{"label":"')):
        spec = {"type": "structural_tag", "triggers": ["<f>"], "structures": [{"begin": "<f>", "schema": schema, "end": "</f>"}]}
        constraint = compiler.compile("structural_tag", spec)
        assert constraint.forced_bytes(constraint.advance_bytes(constraint.initial(), b"<f>"), 64) == first
