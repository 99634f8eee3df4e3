"""Reasoning formats in the runtime: the streamed split against SGLang's own parser, where a prompt leaves
the model (Qwen3's template with and without enable_thinking), and the think-then-constrain constraint
walked at random against a regular-expression oracle of the language it must produce."""
from __future__ import annotations

import random
import re

import numpy as np
import pytest

from radixlang.runtime.constrained.compiler import ConstraintCompiler
from radixlang.runtime.constrained.masks.vocab import TokenVocab
from radixlang.runtime.constrained.think import ANSWER, CLOSE, THINK
from radixlang.runtime.reasoning_formats import (
    REASONING_FORMATS,
    ReasoningStream,
    detect_reasoning_parser,
    prompt_phase,
    reasoning_format,
)
from radixlang.testing.thinking_llama import OPENS_THINKING, thinking_tokenizer

from .models.test_chat_templates import QWEN3

TEXTS = ["plain answer", "<think>plan</think>answer", "plan</think>answer", "<think><think>a</think>b</think>c",
         "<think>cut short", "<think>look<tool_call>{}</tool_call>", "<think>x<|tool_calls_section_begin|>y",
         "◁think▷k◁/think▷v", "[THINK]m[/THINK]n", "", "</think>", "<thin", "<think>a</thi"]


@pytest.mark.parametrize("model_type", sorted(REASONING_FORMATS))
def test_streamed_split_joins_to_sglangs_parse(model_type):
    parser = pytest.importorskip("sglang.srt.parser.reasoning_parser", reason="SGLang's parser is the oracle")
    fmt = reasoning_format(model_type)
    for text in TEXTS:
        theirs = parser.ReasoningParser(model_type).parse_non_stream(text)
        for width in (1, 2, 5):
            stream = ReasoningStream(fmt)
            pieces = [text[i:i + width] for i in range(0, len(text), width)] or [""]
            deltas = [stream.feed(p, i == len(pieces) - 1) for i, p in enumerate(pieces)]
            joined = ("".join(r for r, _ in deltas), "".join(c for _, c in deltas))
            assert joined == theirs, (text, width)


def test_where_a_prompt_leaves_the_model():
    tok = thinking_tokenizer(QWEN3)
    messages = [{"role": "user", "content": "hi"}]
    fmt = reasoning_format(detect_reasoning_parser(QWEN3))
    assert detect_reasoning_parser(QWEN3) == "qwen3" and detect_reasoning_parser(OPENS_THINKING) == "deepseek-r1"
    assert detect_reasoning_parser("{{ messages }}") is None
    assert prompt_phase(fmt, tok.apply_chat_template(messages)) == "open"
    assert prompt_phase(fmt, tok.apply_chat_template(messages, enable_thinking=False)) == "answer"
    assert prompt_phase(fmt, thinking_tokenizer().apply_chat_template(messages)) == "think"
    # after a closed block the reply is all answer; inside an opened one it starts in reasoning
    assert fmt.after_prompt("answer").split("a</think>b") == ("", "a</think>b")
    assert fmt.after_prompt("think").split("a</think>b") == ("a", "b")


@pytest.fixture(scope="module")
def compiler():
    tok = thinking_tokenizer()
    vocab = TokenVocab.from_tokenizer(tok, tok.vocab_size)
    return tok, ConstraintCompiler(lambda: vocab)


ANSWER_RE = r'\{"n": [1-9]\}'


def _random_walk(constraint, rng: random.Random, steps: int) -> tuple[list[int], bool]:
    """Tokens drawn at random from each state's mask (EOS where it may end); True when it ended."""
    state, out = constraint.initial(), []
    for _ in range(steps):
        allowed = np.flatnonzero(constraint.allowed(state))
        if constraint.can_end(state) and (not len(allowed) or rng.random() < 0.3):
            return out, True
        assert len(allowed), "a state with nothing allowed must be able to end"
        token = int(rng.choice(list(allowed)))
        state = constraint.advance(state, token)
        assert state is not None, token
        out.append(token)
    return out, False


@pytest.mark.parametrize("opened", [True, False])
@pytest.mark.parametrize("budget", [0, 1, 5])
def test_random_walks_think_within_the_budget_then_answer(compiler, opened, budget):
    tok, comp = compiler
    think = comp.think_then(comp.compile("regex", ANSWER_RE), "<think>", "</think>", budget, opened)
    rng = random.Random(budget * 2 + opened)
    for _ in range(6):
        tokens, ended = _random_walk(think, rng, 80)
        assert ended
        text = "".join(tok.decode_token(t, skip_special_tokens=False) for t in tokens)
        m = re.fullmatch(("" if opened else "<think>") + r"(.*?)</think>(" + ANSWER_RE + ")", text, re.S)
        assert m, text
        # thinking tokens: those after the start marker (when written) up to the end marker's first
        first = 0 if opened else next(i for i in range(len(tokens) + 1)
                                      if tok.decode(tokens[:i], skip_special_tokens=False).startswith("<think>"))
        spelled = [i for i in range(first, len(tokens) + 1)
                   if m.group(1).startswith(tok.decode(tokens[first:i], skip_special_tokens=False))]
        assert max(spelled) - first <= budget


def test_the_budget_forces_the_end_marker_and_the_answers_start(compiler):
    tok, comp = compiler
    think = comp.think_then(comp.compile("regex", "ab+"), "<think>", "</think>", 2, True)
    state = think.initial()
    assert state[0] == THINK and think.forced_bytes(state, 64) == b""
    assert not think.can_end(state)
    for word in ("hello", " world"):
        state = think.advance(state, tok.encode(word, add_special_tokens=False)[0])
    assert state[0] == CLOSE
    assert think.forced_bytes(state, 64) == b"</think>ab"  # jump-forward drafts the marker and the answer's start
    mask = think.allowed(state)
    end_id = tok.encode("</think>", add_special_tokens=False)[0]
    assert mask[end_id] and not mask[tok.encode("hello", add_special_tokens=False)[0]]
    # a drafted token may cross from the marker into the answer
    nxt = think.advance_bytes(state, b"</think>a")
    assert nxt is not None and nxt[0] == ANSWER and not think.can_end(nxt)
    assert think.advance_bytes(state, b"</think>x") is None


def test_a_budget_spent_inside_a_character_closes_after_it(compiler):
    """Byte-level tokens may split a UTF-8 character: the block cannot close inside it, so it closes once
    the character is whole."""
    tok, comp = compiler
    think = comp.think_then(None, "<think>", "</think>", 1, True)
    vocab = comp.vocab
    half = next(i for i in vocab.ids.tolist() if vocab.token_bytes[i] == "é".encode()[:1])
    rest = next(i for i in vocab.ids.tolist() if vocab.token_bytes[i] == "é".encode()[1:])
    state = think.advance(think.initial(), half)
    assert state[0] == THINK and think.allowed(state)[rest]
    state = think.advance(state, rest)
    assert state[0] == CLOSE and think.forced_bytes(state, 64) == b"</think>"


@pytest.mark.parametrize("model_type", ["deepseek-r1", "qwen3", "kimi_k2"])
def test_held_reasoning_arrives_whole_when_sglangs_does(model_type):
    """stream_reasoning=false: the reasoning in one delta, at the piece where SGLang's parser (the oracle, with
    stream_reasoning=False) releases it, and the deltas still join to the whole split (SGLang's own stream
    keeps a repeated start marker that its whole-text parse drops: the text is checked against the latter)."""
    parser = pytest.importorskip("sglang.srt.parser.reasoning_parser", reason="SGLang's parser is the oracle")
    fmt = reasoning_format(model_type)
    for text in TEXTS:
        if fmt.end not in text:
            continue  # a block still open at the end: SGLang's stream never releases it, ours does at finish
        for width in (1, 3):
            ours, theirs = ReasoningStream(fmt, hold_reasoning=True), parser.ReasoningParser(model_type, False)
            pieces = [text[i:i + width] for i in range(0, len(text), width)]
            deltas = [ours.feed(p, i == len(pieces) - 1) for i, p in enumerate(pieces)]
            their = [theirs.parse_stream_chunk(p)[0] or "" for p in pieces]
            assert [bool(r) for r, _ in deltas] == [bool(r) for r in their], (text, width)
            assert sum(bool(r) for r, _ in deltas) <= 1
            assert ("".join(r for r, _ in deltas), "".join(c for _, c in deltas)) == fmt.split(text)
