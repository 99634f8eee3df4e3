"""An object's undeclared keys where the schema says nothing of them (json_keys): any raw key but the
declared names, built from the names' trie.

Oracle: the general construction, automaton.difference of `"` STRING_CHARS* `"` and the quoted names
(determinize, product, minimize): both are minimal, so the two DFAs must be one up to state numbering.
"""
from __future__ import annotations

import random

import pytest

from radixlang.runtime.constrained.jsonschema.json_keys import raw_keys_except
from radixlang.runtime.constrained.jsonschema.json_scalars import STRING_CHARS, quoted
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
