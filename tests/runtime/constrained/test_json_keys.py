"""An object's undeclared keys (json_keys), built from the declared names' trie: where the schema says nothing
of them, any raw key but the names; where it allows them, any JSON string, escapes too, but none that decodes
to a name.

Oracles: the general construction, automaton.difference of `"` STRING_CHARS* `"` (or `"` STRING_CHAR* `"`) and
the quoted names (or their spellings): determinize, product, minimize; both are minimal, so the two DFAs must be
one up to state numbering (and, for the escaped keys, the order of the alphabet's classes). And Python's own
JSON decoder on random keys.
"""
from __future__ import annotations

import json
import random

import pytest

from radixlang.runtime.constrained.jsonschema.json_keys import keys_except, raw_keys_except
from radixlang.runtime.constrained.jsonschema.json_scalars import STRING_CHARS, quoted, spellings, string_body
from radixlang.runtime.constrained.regex import regex_ast as ra
from radixlang.runtime.constrained.regex.alphabet import CharDfa
from radixlang.runtime.constrained.regex.automaton import difference


def same_up_to_numbering(a: CharDfa, b: CharDfa) -> bool:
    """Whether walking both from their starts pairs each state of `a` with one of `b`, one to one, with
    the same acceptance and the same moves."""
    if a.alphabet.classes != b.alphabet.classes or a.trans.shape != b.trans.shape:
        return False
    pair, stack = {a.start: b.start}, [a.start]
    while stack:
        x = stack.pop()
        if (a.accept[x] >= 0) != (b.accept[pair[x]] >= 0):
            return False
        for tx, ty in zip(a.trans[x].tolist(), b.trans[pair[x]].tolist()):
            if (tx < 0) != (ty < 0):
                return False
            if tx >= 0 and tx not in pair:
                pair[tx] = ty
                stack.append(tx)
            elif tx >= 0 and pair[tx] != ty:
                return False
    return len(pair) == len(a.trans) == len(set(pair.values()))


def by_difference(names: list[str]) -> CharDfa:
    return difference(quoted(ra.repeat(ra.Chars(STRING_CHARS), 0, None)), quoted(ra.alt(*map(ra.literal, names))))


_RNG = random.Random(7)
_LETTERS = 'ab\u00e9\u4e2d\U0001f600\\"'  # \\ and " are outside STRING_CHARS: a raw key never spells such a name
_RANDOM = [["".join(_RNG.choice(_LETTERS) for _ in range(_RNG.randint(0, 4))) for _ in range(_RNG.randint(1, 6))]
           for _ in range(40)]


@pytest.mark.parametrize("names", [
    ["a"], [""], ["a", "ab", "abc"], ["fooId", "barId", "bazId"], ['\\"q', "a\\nb"], ["id", "id"], *_RANDOM])
def test_the_trie_dfa_is_the_minimal_difference(names):
    assert same_up_to_numbering(raw_keys_except(names), by_difference(names))


def classes_in_order(dfa: CharDfa) -> CharDfa:
    """`dfa` with its alphabet's classes (and columns) sorted by their code points."""
    order = sorted(range(len(dfa.alphabet.classes)), key=lambda k: dfa.alphabet.classes[k])
    alphabet = type(dfa.alphabet)(tuple(dfa.alphabet.classes[k] for k in order), dfa.alphabet.widths[order], {})
    return CharDfa(dfa.trans[:, order], dfa.accept, alphabet)


def escaped_by_difference(names: list[str]) -> CharDfa:
    return difference(quoted(string_body()), quoted(ra.alt(*map(spellings, names))))


# escapable characters, a name's (the quote, the backslash, a control), BMP ones whose \\u escape starts with d (no
# surrogate: never spelled escaped), a lone surrogate, and one past the BMP (raw only)
_ESCAPED_LETTERS = 'ab"\\\n/\u00e9\u4e2d\ud55c\ud7ff\ud800\U0001f600\u0100'
_ESCAPED_RANDOM = [["".join(_RNG.choice(_ESCAPED_LETTERS) for _ in range(_RNG.randint(0, 4)))
                    for _ in range(_RNG.randint(1, 5))] for _ in range(40)]


@pytest.mark.parametrize("names", [["a"], [""], ["a", "ab", "abc"], ["fooId", "barId"], ['"q', "a\nb"], *_ESCAPED_RANDOM])
def test_the_escaped_trie_dfa_is_the_minimal_difference(names):
    assert same_up_to_numbering(classes_in_order(keys_except(names)), classes_in_order(escaped_by_difference(names)))


def accepts_chars(dfa: CharDfa, text: str) -> bool:
    starts = [ranges for ranges in dfa.alphabet.classes]
    state = dfa.start
    for ch in text:
        k = next((k for k, ranges in enumerate(starts) if any(lo <= ord(ch) <= hi for lo, hi in ranges)), None)
        if k is None or (state := int(dfa.trans[state, k])) < 0:
            return False
    return bool(dfa.accept[state] >= 0)


def test_escaped_keys_are_the_json_strings_that_decode_to_no_name():
    """Random JSON string literals, raw or escaped character by character (\\uXXXX in either case, short escapes),
    against Python's decoder: accepted exactly when they decode to no name; bad escapes never."""
    rng = random.Random(3)
    names = ["id", "na\u00efve", 'q"t', "\u4e2d\n", ""]
    dfa = keys_except(names)
    short = {'"': '\\"', "\\": "\\\\", "/": "\\/", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}
    for _ in range(400):
        text = rng.choice([*names, "x", "i", "ide", "\u4e2d", "na"])
        spelled = ""
        for ch in text:
            options = [f"\\u{ord(ch):04x}", f"\\u{ord(ch):04X}"]
            options += [short[ch]] if ch in short else []
            options += [ch] if ch not in '"\\' and ord(ch) >= 0x20 else []
            spelled += rng.choice(options)
        literal = f'"{spelled}"'
        assert accepts_chars(dfa, literal) == (json.loads(literal) not in names), literal
    for bad in ('"\\ud800"', '"\\x41"', '"\\u12"', '"a\nb"', '"\\"'):  # a surrogate, bad escapes, a raw control
        assert not accepts_chars(dfa, bad), bad


def same_language(a: ra.Node, b: ra.Node) -> bool:
    return difference(a, b).accept.max() < 0 and difference(b, a).accept.max() < 0


@pytest.mark.parametrize("seed", range(12))
def test_a_raw_key_from_the_names_trie_is_the_difference_with_their_spellings(seed):
    """patternProperties' keys (raw characters only) beside declared names and other patterns: built from the names'
    trie (json_objects._raw_key), the language of the difference with the names' escaped spellings and the other
    patterns (as it was built before)."""
    from radixlang.runtime.constrained.jsonschema.json_objects import _raw_key
    from radixlang.runtime.constrained.jsonschema.json_scalars import pattern_body

    rng = random.Random(seed)
    pool = ["^a", "b$", "^[ab]+$", "^x_", "é", "^.{2}$", "^\\d+$", "q"]
    patterns = [pattern_body(p, "#") for p in rng.sample(pool, rng.randint(1, 3))]
    names = ["".join(rng.choice('ab\u00e9x_1"\\') for _ in range(rng.randint(0, 3))) for _ in range(rng.randint(0, 4))]
    body, others = patterns[0], patterns[1:]
    excluded = [*map(spellings, names), *others]
    before = ra.Compiled(difference(quoted(body), quoted(ra.alt(*excluded)))) if excluded else quoted(body)
    assert same_language(_raw_key(body, names, others), before)
