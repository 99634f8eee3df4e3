"""Closing within max_tokens (constrained/closing.py): a runaway writer (a letter token wherever one is
allowed: strings never end, as with a repeating model) under a Matcher with a token budget ends, at
the budget (or up to CLOSE_SLACK tokens before it), with output that jsonschema accepts; on the DFA, the LALR and the thinking paths."""
from __future__ import annotations

import json

import numpy as np
import pytest

from radixlang.runtime.config import CLOSE_SLACK
from radixlang.runtime.constrained.closing import close_tokens
from radixlang.runtime.constrained.matcher import Matcher
from radixlang.runtime.constrained.structural_tag import parse_structural_tag, split_tagged
from radixlang.runtime.tool_formats import HERMES, tool_call_structural_tag

jsonschema = pytest.importorskip("jsonschema", reason="jsonschema is the oracle for the closed outputs")

NOTE = {"type": "object", "properties": {"title": {"type": "string"}, "tags": {"type": "array", "items": {
    "type": "string"}}, "n": {"type": "integer"}}, "required": ["title", "tags", "n"], "additionalProperties": False}
# compiled in the strict form (declared order, closed): the LALR path's close is a greedy walk, not the shortest
# completion, and any-order or open objects lead it astray (it writes an optional key first; docs/reasoning.md)
TREE = {"type": "object", "properties": {"name": {"type": "string"}, "kids": {"type": "array", "items": {"$ref": "#"}}},
        "required": ["name"]}
TOOLS = [{"name": "note", "parameters": NOTE}, {"name": "tree", "parameters": TREE}]


def runaway(matcher: Matcher, budget: int, letter: int, nest: int) -> list[int]:
    """Up to `budget` tokens: `letter` where allowed, else `nest` (opens structure), else the lowest allowed."""
    return write(matcher, budget, lambda state, allowed: letter if letter in allowed else nest if nest in allowed
                 else int(allowed[0]))


def write(matcher: Matcher, budget: int, pick) -> list[int]:
    """Up to `budget` tokens, each `pick(state, allowed)` (EOS never), until the close ends the output or,
    where it may end, no more fits (the engine's output processor does the same)."""
    out: list[int] = []
    while len(out) < budget and not matcher.closed(matcher.state, len(out)):
        words = matcher.mask_words(matcher.state, len(out))
        allowed = np.flatnonzero(np.unpackbits(words.view(np.uint8), bitorder="little"))
        allowed = allowed[~np.isin(allowed, matcher.end_ids)]
        if not allowed.size or matcher.no_room(matcher.state, len(out)):
            break
        token = pick(matcher.state, allowed)
        assert matcher.advance(token)
        out.append(token)
    return out


def text_of(vocab, tokens) -> str:
    return b"".join(vocab.bytes_of(t) for t in tokens).decode()


@pytest.mark.parametrize("schema", [NOTE, TREE], ids=["dfa", "lalr"])
@pytest.mark.parametrize("budget", [20, 41])
def test_a_runaway_json_answer_ends_valid_at_the_budget(compiler, tokenizer, schema, budget):
    constraint = compiler.compile("json_schema_strict" if schema is TREE else "json_schema", schema)
    letter, nest = tokenizer.encode("x", add_special_tokens=False)[0], tokenizer.encode("{", add_special_tokens=False)[0]
    tokens = runaway(Matcher(constraint, constraint.vocab.end_ids, budget), budget, letter, nest)
    assert budget - CLOSE_SLACK <= len(tokens) <= budget
    jsonschema.validate(json.loads(text_of(constraint.vocab, tokens)), schema)
    cut = runaway(Matcher(constraint, constraint.vocab.end_ids), budget, letter, nest)  # no budget: cut
    with pytest.raises(json.JSONDecodeError):
        json.loads(text_of(constraint.vocab, cut))


PING = [{"name": "ping", "parameters": {"type": "object", "properties": {}, "additionalProperties": False}}]


@pytest.mark.parametrize("think", [False, True])
def test_a_tool_call_list_cut_by_the_budget_ends_with_every_call_whole_and_valid(compiler, tokenizer, think):
    """A string that never ends: the close ends the call within the budget."""
    tag = tool_call_structural_tag(HERMES, TOOLS, "required", parallel=True)
    constraint = compiler.compile("structural_tag", tag)
    if think:  # still thinking when the budget nears: the block closes, then the call
        constraint = compiler.think_then(constraint, "<think>", "</think>", None, True)
    letter = tokenizer.encode("x", add_special_tokens=False)[0]
    budget = 96  # the writer spells the forced begin byte by byte (about 40 tokens)
    tokens = runaway(Matcher(constraint, constraint.vocab.end_ids, budget), budget, letter, letter)
    assert budget - CLOSE_SLACK <= len(tokens) <= budget
    text = text_of(constraint.vocab, tokens)
    if think:
        thought, text = text.split("</think>")
        assert "x" in thought
    else:
        assert "x" in text  # the string ran before the close
    assert_whole_valid_calls(text, tag, TOOLS)


def test_a_call_list_that_goes_on_ends_before_a_call_that_cannot_fit(compiler):
    """Calls end at once but the list goes on: after two, the 10 tokens left cannot hold a third."""
    tag = tool_call_structural_tag(HERMES, PING, "required", parallel=True)
    constraint = compiler.compile("structural_tag", tag)
    call = close_tokens(constraint, constraint.initial())
    budget = 2 * len(call) + 10
    tokens = write(Matcher(constraint, constraint.vocab.end_ids, budget), budget,  # a call, fast, again and again
                   lambda state, allowed: close_tokens(constraint, state, nonempty=constraint.can_end(state))[0])
    assert tokens == 2 * list(call)
    assert_whole_valid_calls(text_of(constraint.vocab, tokens), tag, PING)


def assert_whole_valid_calls(text: str, tag: dict, tools: list[dict]) -> None:
    parts = split_tagged(text, parse_structural_tag(tag))
    assert parts and all(i is not None for i, _ in parts)
    for i, body in parts:
        jsonschema.validate(json.loads(body), tools[i]["parameters"])
