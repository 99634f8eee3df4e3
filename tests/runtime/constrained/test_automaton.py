"""Regex -> byte DFA, checked against Python's own `re.fullmatch` on random strings."""
from __future__ import annotations

import contextlib
import itertools
import random
import re
import signal

import numpy as np
import pytest
from hypothesis import given, reject, settings
from hypothesis import strategies as st

from radixlang.runtime.config import MAX_DFA_STATES
from radixlang.runtime.constrained.regex import regex_ast as ra
from radixlang.runtime.constrained.regex.automaton import compile_dfa, exactly_one
from radixlang.runtime.constrained.regex.fsa import refine
from radixlang.runtime.constrained.regex.regex_parser import parse_regex

from ...conftest import CHARACTER_REGEX

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


# ---- Unicode templates (SGLang's character regex) and random regexes, against re.fullmatch -----------
TEMPLATES = [
    CHARACTER_REGEX,
    r'\{"name": "\w+", "city": "[\w ]+", "id": [0-9]{1,6}\}',
    r'\{"title": "[^"]{1,64}", "tags": \["[^"]{0,8}"(, "[^"]{0,8}"){0,3}\]\}',
]
MUTATIONS = "aZ9 _\"\n\t,.é中😀\u00a0\u2003٣ǅ"


def sample(dfa, rng: random.Random, max_bytes: int = 600) -> bytes | None:
    """A random string the DFA accepts (a walk over live bytes), or None if the walk ran too long."""
    state, out = dfa.start, bytearray()
    while len(out) < max_bytes:
        if dfa.accept[state] >= 0 and rng.random() < 0.1:
            return bytes(out)
        live = np.flatnonzero(dfa.row(state) >= 0)
        if not live.size:
            break
        out.append(int(live[rng.randrange(live.size)]))
        state = dfa.step(state, out[-1])
    return bytes(out) if dfa.accept[state] >= 0 else None


def mutate(text: str, rng: random.Random) -> str:
    i = rng.randrange(len(text) + 1)
    kind = rng.randrange(3)
    if kind == 0 or not text[i:]:
        return text[:i] + rng.choice(MUTATIONS) + text[i:]
    return text[:i] + (rng.choice(MUTATIONS) if kind == 1 else "") + text[i + 1:]


def check_samples_and_mutations(pattern: str, dfa, rng: random.Random, n: int, max_bytes: int = 600) -> None:
    for _ in range(n):
        data = sample(dfa, rng, max_bytes)
        if data is None:
            continue
        text = data.decode()  # every accepted byte string is well-formed UTF-8
        assert re.fullmatch(pattern, text), (pattern, text)
        for _ in range(3):
            wrong = mutate(text, rng)
            assert accepts(dfa, wrong) == bool(re.fullmatch(pattern, wrong)), (pattern, wrong)


@pytest.mark.parametrize("pattern", TEMPLATES)
def test_json_like_templates_with_unicode_fields_compile_and_match_re(pattern):
    dfa = compile_dfa([parse_regex(pattern)])
    check_samples_and_mutations(pattern, dfa, random.Random(pattern), 60)


def test_the_character_regex_is_a_minimal_dfa_within_the_state_limit():
    dfa = compile_dfa([parse_regex(CHARACTER_REGEX)])
    assert len(np.unique(refine(dfa.trans, dfa.accept))) == dfa.num_states <= MAX_DFA_STATES


ATOMS = ["a", "b", "é", "中", "😀", r"\n", r"\w", r"\d", r"\s", r"\W", r"\S", r"[\w\d\s]", r'[^"]', ".",
         "[a-zé]", r"[\u0100-\u07ff]", r"[\u0800-\uffff]", "[^a-z]", "[0-9]", "[😀-😂]"]
QUANTIFIERS = ["*", "+", "?", "{2}", "{0,2}", "{1,3}"]
small = st.recursive(
    st.one_of(st.sampled_from(ATOMS), st.tuples(st.sampled_from(ATOMS), st.sampled_from(QUANTIFIERS)).map("".join)),
    lambda inner: st.one_of(
        st.lists(inner, min_size=2, max_size=3).map("".join),  # concatenation
        st.lists(inner, min_size=2, max_size=3).map(lambda xs: "(" + "|".join(xs) + ")"),  # alternation
        # bounded repetition of groups: nested stars make re.fullmatch (the oracle) backtrack for ages
        st.tuples(inner, st.sampled_from(["?", "{2}", "{0,2}", "{1,3}"])).map(lambda t: f"(?:{t[0]}){t[1]}"),
    ), max_leaves=5)
# long bounded repeats as template fields: quoted, of a class without the quote (where the field
# starts must stay known, or the DFA may be exponential, as for `.*a.{16}`)
FIELD_CLASSES = [r"\w", r"\d", r"\s", r"[\w\d\s]", r'[^"]', "[a-zé]", r"[\u0100-\u07ff]", r"[\u0800-\uffff]"]
fields = st.tuples(st.sampled_from(FIELD_CLASSES), st.sampled_from(["{1,16}", "{0,5}", "{3}"])).map(
    lambda t: f'"{t[0]}{t[1]}"')
regexes = st.lists(st.one_of(small, fields), min_size=1, max_size=3).map("".join)


def compile_or_reject(node: ra.Node):
    """The DFA of a random regex; a truly exponential one (`[^"]*.[^a-z]{9}`-like) must be refused
    with the clear error, and is no example."""
    try:
        return compile_dfa([node])
    except ValueError as e:
        assert "too large" in str(e)
        reject()


class OracleTimeout(Exception):
    pass


@contextlib.contextmanager
def oracle_deadline(seconds: float):
    """re backtracks exponentially on some nested repeats (`(?:(?:[a-z]+){2}){3}` against a long
    near-miss): an example the oracle cannot answer in time is rejected, not waited on for hours."""
    def expire(*_):
        raise OracleTimeout

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    except OracleTimeout:
        reject()
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


@settings(max_examples=150, deadline=None)
@given(regexes, st.randoms(use_true_random=False))
def test_random_unicode_regexes_accept_what_re_fullmatch_accepts(pattern, rng):
    dfa = compile_or_reject(parse_regex(pattern))
    with oracle_deadline(5.0):
        check_samples_and_mutations(pattern, dfa, rng, 15, max_bytes=80)
        for _ in range(20):
            text = "".join(rng.choice(ALPHABET + MUTATIONS) for _ in range(rng.randint(0, 5)))
            assert accepts(dfa, text) == bool(re.fullmatch(pattern, text)), (pattern, text)
    assert len(np.unique(refine(dfa.trans, dfa.accept))) == dfa.num_states  # minimal


def test_the_state_limit_counts_merged_states_not_each_character_states_decoder_copy():
    """452 character states, whose copies of their Unicode decoders alone exceed the limit, are 6502
    byte states once mid-character states that read alike are merged: the regex compiles."""
    pattern = r"[\w\d\s]*a*a*a*a+(?:(?:.\s{1,3}){2}){1,3}"
    dfa = compile_dfa([parse_regex(pattern)])
    assert dfa.num_states < MAX_DFA_STATES
    check_samples_and_mutations(pattern, dfa, random.Random(0), 40, max_bytes=80)


@settings(max_examples=40, deadline=None)
@given(regexes, st.integers(0, 9), st.randoms(use_true_random=False))
def test_bounded_matches_are_the_matches_of_at_most_that_many_bytes(pattern, limit, rng):
    dfa = compile_or_reject(ra.Bounded(parse_regex(pattern), limit))
    for _ in range(30):
        text = "".join(rng.choice(ALPHABET + MUTATIONS) for _ in range(rng.randint(0, 4)))
        expected = len(text.encode()) <= limit and bool(re.fullmatch(pattern, text))
        assert accepts(dfa, text) == expected, (pattern, limit, text)
    for _ in range(10):
        data = sample(dfa, rng, 80)
        assert data is None or (len(data) <= limit and re.fullmatch(pattern, data.decode()))


def test_an_embedded_dfa_whose_start_loops_is_left_only_through_acceptance():
    looping = ra.Compiled(exactly_one([parse_regex("(ab)*c"), parse_regex("z")]))  # back to start after "ab"
    dfa = compile_dfa([ra.seq(ra.repeat(looping, 0, None), ra.literal("x"))])
    for n in range(7):
        for word in itertools.product("abczx", repeat=n):
            text = "".join(word)
            assert accepts(dfa, text) == bool(re.fullmatch(r"((ab)*c|z)*x", text)), text


def test_exactly_one_of_unicode_branches():
    a, b = r"\w{1,3}", r"[a-zé中]+"
    dfa = compile_dfa([ra.Compiled(exactly_one([parse_regex(a), parse_regex(b)]))])
    rng = random.Random(1)
    for _ in range(3000):
        text = "".join(rng.choice("aé中_9 😀Z") for _ in range(rng.randint(0, 5)))
        assert accepts(dfa, text) == (bool(re.fullmatch(a, text)) != bool(re.fullmatch(b, text))), text


CASED = [cp for cp in range(0x110000) if chr(cp).lower() != chr(cp) or chr(cp).upper() != chr(cp)]


@pytest.mark.parametrize("pattern", [
    "(?i)s", "(?i)ſ", "(?i)k", "(?i)\u212a", "(?i)i", "(?i)İ", "(?i)ı", "(?i)µ", "(?i)ß", "(?i)\u2126",
    "(?i)\u03c3", "(?i)\u0345", "(?i)[^s]", "(?i)[a-z]", "(?i)[\u0370-\u03ff]", "(?i)[\U00010400-\U0001044f]",
    "(?i)[^\u0130-\u017f]", "(?ai)[a-zé]", "(?ai)k", "(?i)\u01c5", "(?i)[\u1f80-\u1faf]",
])
def test_ignorecase_matches_what_re_matches_over_every_cased_character(pattern):
    """Python's own case rules (simple mappings plus its extra equivalences), checked on each code
    point that has a case mapping, and on a few that have none."""
    dfa = compile_dfa([parse_regex(pattern)])
    for cp in CASED + [0x30, 0x20, 0x4E2D, 0x1F600]:
        text = chr(cp)
        assert accepts(dfa, text) == bool(re.fullmatch(pattern, text)), (pattern, hex(cp))


@pytest.mark.parametrize("pattern, expected", [
    (r"[a-c]+x?", (1, None)), (r"(ab|cd){1,3}e?", (2, 7)), (r"a|", (0, 1)), (r"[\u0100-\uffff]{1,2}|[😀-😂]", (1, 2)),
    (r"\d{2}-\w{0,4}", (3, 7)), (r"x(y|zz)w", (3, 4))])
def test_length_range_is_the_fewest_and_most_characters_of_a_match(pattern, expected):
    """Against brute force: the shortest and longest matches among strings over the pattern's letters."""
    from radixlang.runtime.constrained.regex.automaton import length_range
    assert length_range(parse_regex(pattern)) == expected
    if expected[1] is not None and expected[1] <= 4:  # every string up to one character past the most
        letters = "abcxyzw-0\u0101😀"
        lengths = [n for n in range(expected[1] + 2) for s in itertools.product(letters, repeat=n)
                   if re.fullmatch(pattern, "".join(s))]
        assert (min(lengths), max(lengths)) == expected


def test_alt_keeps_the_first_of_equal_alternatives_in_order():
    """`ra.alt` flattens nested alternatives and drops repeats (by equality, as a list's `in` does)."""
    rng = random.Random(0)
    leaves = [ra.literal(w) for w in ("a", "b", "ab", "ba")] + [ra.repeat(ra.literal("a"), 0, None)]
    for _ in range(50):
        items = [rng.choice(leaves) if rng.random() < 0.7 else ra.Alt(tuple(rng.sample(leaves, 2)))
                 for _ in range(rng.randint(1, 8))]
        expected: list = []
        for item in items:
            for x in item.items if isinstance(item, ra.Alt) else (item,):
                if x not in expected:
                    expected.append(x)
        assert ra.alt(*items) == (expected[0] if len(expected) == 1 else ra.Alt(tuple(expected)))
