"""Automata cached by content: the cached and projected automata read what Python's `re` reads, a
repeated language is built once, and the cache stays within its bounds."""
from __future__ import annotations

import itertools
import re

import numpy as np
import pytest

from radixlang.runtime.constrained.compiler import ConstraintCompiler
from radixlang.runtime.constrained.regex import automaton
from radixlang.runtime.constrained.regex import regex_ast as ra
from radixlang.runtime.constrained.regex.alphabet import alphabet_of
from radixlang.runtime.constrained.regex.automaton import (
    Dfa,
    char_sets,
    compile_chars,
    compile_dfa,
    difference,
    exactly_one,
    intersection,
)
from radixlang.runtime.constrained.regex.dfa_cache import DfaCache, caching
from radixlang.runtime.constrained.regex.regex_parser import parse_regex

PATTERNS = [r"[a-c]+x?", r"(ab|cd)*e{0,2}", r"[^a-c\n]{1,3}", r"a|b[x-zé]", r"(x|é)*[a-e]"]
WORDS = ["".join(w) for n in range(5) for w in itertools.product("abcdexé\n", repeat=n)]


def char_accepts(dfa, text: str) -> bool:
    """Walks a character DFA: each character through the class that holds it (none: dead)."""
    state = dfa.start
    for ch in text:
        cls = [c for c, ranges in enumerate(dfa.alphabet.classes) if any(lo <= ord(ch) <= hi for lo, hi in ranges)]
        state = int(dfa.trans[state, cls[0]]) if cls else -1
        if state < 0:
            return False
    return bool(dfa.accept[state] >= 0)


@pytest.mark.parametrize("pattern", PATTERNS)
def test_a_dfa_projected_onto_a_finer_alphabet_reads_what_re_reads(pattern):
    node = parse_regex(pattern)
    finer = alphabet_of(char_sets([node, *map(parse_regex, PATTERNS)]))  # every pattern's classes cut it
    with caching(DfaCache()):
        own = compile_chars([node], alphabet_of(char_sets([node])))
        dfa = compile_chars([node], finer)
    assert dfa.alphabet is finer and len(dfa.trans) == len(own.trans)
    for word in WORDS:
        assert char_accepts(dfa, word) == bool(re.fullmatch(pattern, word)), word


@pytest.mark.parametrize("a, b", list(itertools.combinations(PATTERNS, 2)))
def test_cached_products_read_what_re_reads_and_are_built_once(a, b, monkeypatch):
    builds = []
    real = automaton._product
    monkeypatch.setattr(automaton, "_product", lambda *args: builds.append(1) or real(*args))
    truth = {
        intersection: lambda w: bool(re.fullmatch(a, w)) and bool(re.fullmatch(b, w)),
        exactly_one: lambda w: bool(re.fullmatch(a, w)) != bool(re.fullmatch(b, w)),
        difference: lambda w: bool(re.fullmatch(a, w)) and not re.fullmatch(b, w),
    }
    with caching(DfaCache()):
        for op, expected in truth.items():
            args = (parse_regex(a), parse_regex(b))
            dfa = op(*args) if op is difference else op(list(args))
            again = op(parse_regex(a), parse_regex(b)) if op is difference else op([parse_regex(a), parse_regex(b)])
            assert again is dfa  # equal trees, fresh objects: one build
            for word in WORDS:
                assert char_accepts(dfa, word) == expected(word), (op.__name__, word)
    assert len(builds) == 3


def test_compiled_leaves_are_equal_exactly_when_their_automaton_is_the_same_object():
    with caching(DfaCache()):
        dfa = intersection([parse_regex("[a-c]+"), parse_regex("a{1,3}")])
        assert ra.Compiled(dfa) == ra.Compiled(dfa) and hash(ra.Compiled(dfa)) == hash(ra.Compiled(dfa))
        assert ra.seq(ra.Compiled(dfa), ra.literal("x")) == ra.seq(ra.Compiled(dfa), ra.literal("x"))
        other = intersection([parse_regex("[a-c]+"), parse_regex("a{1,4}")])
        assert ra.Compiled(dfa) != ra.Compiled(other)
        byte_dfa = compile_dfa([ra.seq(ra.Compiled(dfa), ra.literal("x"))])
        assert compile_dfa([ra.seq(ra.Compiled(dfa), ra.literal("x"))]) is byte_dfa


def test_without_a_cache_nothing_is_kept_and_results_are_writable():
    first, second = compile_dfa([parse_regex("ab+")]), compile_dfa([parse_regex("ab+")])
    assert first is not second and first.trans.flags.writeable


def test_cached_automata_are_read_only():
    with caching(DfaCache()):
        dfa = compile_dfa([parse_regex("ab+")])
    with pytest.raises(ValueError, match="read-only"):
        dfa.trans[0, 0] = 1


def test_the_cache_drops_its_least_recently_used_entries_beyond_its_bounds():
    def table() -> Dfa:
        return Dfa(np.zeros((2, 256), np.int32), np.zeros(2, np.int32))
    size = table().trans.nbytes + table().accept.nbytes
    cache = DfaCache(max_bytes=3 * size, max_entries=10)
    kept = {key: cache.get(key, table) for key in "abc"}
    assert len(cache) == 3 and cache.bytes == 3 * size
    assert cache.get("a", table) is kept["a"]  # now the most recent: "b" goes first
    cache.get("d", table)
    assert len(cache) == 3 and cache.bytes == 3 * size
    assert cache.get("a", table) is kept["a"] and cache.get("c", table) is kept["c"]
    assert cache.get("b", table) is not kept["b"]
    by_count = DfaCache(max_entries=2)
    for key in "abc":
        by_count.get(key, table)
    assert len(by_count) == 2


def test_a_compiler_reuses_a_language_across_its_compiles_and_masks_stay_the_same(vocab):
    schema = {"type": "object", "properties": {"a": {"type": "string", "pattern": "^[a-z]+$", "maxLength": 5}},
              "required": ["a"]}
    other = {**schema, "properties": {"a": schema["properties"]["a"], "b": {"type": "integer"}}}
    compiler = ConstraintCompiler(lambda: vocab)
    compiler.compile("json_schema", schema)
    held = len(compiler._dfas)
    assert held > 0
    warm = compiler.compile("json_schema", other)
    cold = ConstraintCompiler(lambda: vocab).compile("json_schema", other)
    for text in ('{"a":"', '{"a":"abc', '{"a":"abcde"', '{"a":"x","b":1'):
        s_warm, s_cold = warm.advance_bytes(warm.initial(), text.encode()), cold.advance_bytes(cold.initial(), text.encode())
        assert (s_warm is None) == (s_cold is None)
        if s_warm is not None:
            assert np.array_equal(warm.allowed(s_warm), cold.allowed(s_cold))
