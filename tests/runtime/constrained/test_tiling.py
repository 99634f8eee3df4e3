"""Long bounded repeats built as tiled copies (regex/tiling.py) against the unrolled construction's minimal DFA,
and against Python's `re` on strings around the bounds."""
from __future__ import annotations

import random
import re

import pytest

from radixlang.runtime.constrained.jsonschema.json_scalars import string_body, string_node
from radixlang.runtime.constrained.regex import automaton
from radixlang.runtime.constrained.regex import regex_ast as ra
from radixlang.runtime.constrained.regex.alphabet import alphabet_of
from radixlang.runtime.constrained.regex.fsa import ConstraintTooLarge
from radixlang.runtime.constrained.regex.regex_parser import parse_regex


def canonical(dfa) -> tuple[list[tuple[int, ...]], list[object]]:
    """The DFA's states renumbered breadth first from its start, with what each accepts (a reading's patterns
    rather than its number): equal for two minimal DFAs exactly when their languages and labels are."""
    order, queue = {dfa.start: 0}, [dfa.start]
    for state in queue:
        for t in dfa.trans[state].tolist():
            if t >= 0 and t not in order:
                order[t] = len(order)
                queue.append(t)
    rows = [tuple(order[t] if t >= 0 else -1 for t in dfa.trans[s].tolist()) for s in queue]
    labels = [None if dfa.accept[s] < 0 else dfa.readings[dfa.accept[s]] if dfa.readings else int(dfa.accept[s])
              for s in queue]
    assert len(queue) == len(dfa.trans), "every state is reachable"
    return rows, labels


def built(patterns, nonempty, readings, monkeypatch, tiled: bool):
    """`_determinize`'s DFA, tiled or (tiling switched off) unrolled; and whether tiling made it."""
    expanded = []
    monkeypatch.setattr(automaton, "expand", lambda *a: expanded.append(r := real_expand(*a)) or r)
    monkeypatch.setattr(automaton, "_TILED_MIN_COPIES", 16 if tiled else 10**9)
    dfa = automaton._determinize(patterns, alphabet_of(automaton.char_sets(patterns)), nonempty, readings)
    return dfa, bool(expanded) and expanded[-1] is not None


real_expand = automaton.expand

CASES = {  # name: (patterns, nonempty, readings, tiles)
    "string with escapes and multibyte, m > 0": ([string_node(3, 40)], False, False, True),
    "lexer chunks: the last piece beside a full chunk": (
        [ra.seq(string_body(0, 40), ra.literal('"')), string_body(40, 40)], True, True, True),
    "three repeats of one item, ends overlapping": (
        [ra.seq(string_body(0, 40), ra.literal('"')), string_body(40, 40), string_body(20, 30)], True, False, True),
    "two repeats in a row": ([parse_regex("a{0,20}b{0,20}c")], False, False, True),
    "multi-character items, both bounds": ([parse_regex("x(ab){1,20}(cd){2,20}y")], False, False, True),
    "multibyte items": ([parse_regex("(é|ß|\u4e00x){3,17}z")], False, False, True),
    "a repeat inside a loop": ([parse_regex("(<(é|[a-z]){1,20}>)*")], False, False, True),
    "overlapping first characters: unrolled": ([parse_regex("(ab|c){5,30}d?"), parse_regex("a{3,20}")],
                                               True, True, False),
    "two patterns ending at one copy: unrolled": ([string_body(20, 30), string_body(25, 40)], True, True, False),
    "an item that is not prefix-free: unrolled": ([parse_regex("(a|ab){0,20}c")], False, False, False),
}


@pytest.mark.parametrize("name", CASES)
def test_tiled_dfa_is_the_unrolled_minimal_dfa(name, monkeypatch):
    patterns, nonempty, readings, tiles = CASES[name]
    tiled, used = built(patterns, nonempty, readings, monkeypatch, tiled=True)
    unrolled, _ = built(patterns, nonempty, readings, monkeypatch, tiled=False)
    assert used == tiles
    assert len(tiled.trans) == len(unrolled.trans)
    assert canonical(tiled) == canonical(unrolled)


def test_tiled_dfa_reads_what_re_reads_around_the_bounds():
    pattern = "(?:ab|c|é|\u4e00){2,20}d"
    dfa = automaton.compile_dfa([parse_regex(pattern)])
    rng = random.Random(0)
    for _ in range(1500):
        text = "".join(rng.choice(["ab", "c", "é", "\u4e00", "a", "b"]) for _ in range(rng.randint(0, 23)))
        text += rng.choice(["d", "", "dd", "c"])
        state = dfa.walk(dfa.start, text.encode())
        assert (state >= 0 and dfa.accept[state] >= 0) == bool(re.fullmatch(pattern, text)), text


def test_a_tiled_dfa_over_its_bound_is_refused():
    patterns = [string_node(0, 300)]
    alphabet = alphabet_of(automaton.char_sets(patterns))
    assert len(automaton._determinize(patterns, alphabet, False, max_states=3000).trans) > 2000
    with pytest.raises(ConstraintTooLarge):
        automaton._determinize(patterns, alphabet, False, max_states=2000)


def test_a_long_string_is_tiled_not_unrolled(monkeypatch):
    """1024 characters: ~7k states, unrolled through the subset construction in ~0.1 s; tiled, only the
    skeleton and the character are constructed."""
    calls = []
    monkeypatch.setattr(automaton, "thompson", lambda *a, **k: calls.append(1) or real_thompson(*a, **k))
    dfa = automaton.own_chars([string_node(0, 1024)], False)
    assert len(dfa.trans) == 1024 * 7 + 3  # 7 per character (its escapes), the quotes, the end
    assert len(calls) == 2  # the skeleton and the character, nothing unrolled


real_thompson = automaton.thompson
