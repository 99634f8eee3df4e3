"""Regex -> byte DFA, checked against Python's own `re.fullmatch` on random strings."""
from __future__ import annotations

import random
import re

import pytest

from radixlang.runtime.constrained.automaton import compile_dfa
from radixlang.runtime.constrained.regex_parser import parse_regex

PATTERNS = [
    r"[a-c]+x?",
    r"(ab|cd)*e{2,3}",
    r"\d{2}-\w+",
    r"[^a]é?.",
    r"(?i:hello) world",
    r"-?(0|[1-9][0-9]*)(\.[0-9]+)?",
    r"[\u0100-\uffff]{1,2}|[😀-😂]",
    r"a|",
    r"^(x|y)+?z$",
    r"\s*[^\s\d]\S",
    r"(?s:.)\.",
    r"[\w.]{0,3}@",
]
ALPHABET = "abcdexyz-.@01é \u0101\uffffHEL\n\t😀😃"


def accepts(dfa, text: str) -> bool:
    state = dfa.walk(dfa.start, text.encode())
    return state >= 0 and bool(dfa.accept[state] >= 0)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_dfa_accepts_exactly_what_re_fullmatch_accepts(pattern):
    dfa = compile_dfa([parse_regex(pattern)])
    rng = random.Random(pattern)
    for _ in range(3000):
        text = "".join(rng.choice(ALPHABET) for _ in range(rng.randint(0, 6)))
        assert accepts(dfa, text) == bool(re.fullmatch(pattern, text)), (pattern, text)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_every_live_dfa_state_can_still_reach_acceptance(pattern):
    dfa = compile_dfa([parse_regex(pattern)])
    for state in range(dfa.num_states):
        seen, stack = {state}, [state]
        while stack:
            s = stack.pop()
            for t in set(dfa.trans[s][dfa.trans[s] >= 0].tolist()):
                if t not in seen:
                    seen.add(t)
                    stack.append(t)
        assert any(dfa.accept[s] >= 0 for s in seen) or (state == dfa.start and dfa.num_states == 1)


def test_dfa_is_minimal_for_a_simple_pattern():
    assert compile_dfa([parse_regex(r"(a|b)*c")]).num_states == 2


def test_union_labels_prefer_the_earlier_pattern():
    dfa = compile_dfa([parse_regex("if"), parse_regex("[a-z]+")], nonempty=True)
    assert dfa.accept[dfa.walk(dfa.start, b"if")] == 0
    assert dfa.accept[dfa.walk(dfa.start, b"iff")] == 1
    assert dfa.accept[dfa.start] == -1


def test_nonempty_drops_only_the_empty_match():
    dfa = compile_dfa([parse_regex("(ab)*")], nonempty=True)
    assert not accepts(dfa, "") and accepts(dfa, "ab") and accepts(dfa, "abab")


@pytest.mark.parametrize("pattern, what", [
    (r"(?=a)a", "look-ahead"), (r"(a)\1", "back-reference"), (r"a\bb", "anchor"), (r"a^b", "anchor"),
    (r"(?<!x)y", "look"), (r"a++", "possessive"), (r"(", "invalid regex"),
])
def test_unsupported_or_invalid_regex_raises_a_clear_value_error(pattern, what):
    with pytest.raises(ValueError, match=what):
        compile_dfa([parse_regex(pattern)])


def test_finiteness_check():
    assert compile_dfa([parse_regex("[ \n]{0,4}")]).is_finite()
    assert not compile_dfa([parse_regex("[ \n]*")]).is_finite()
