"""Character transitions as UTF-8 bytes: exactly the well-formed encodings, each to its own target.

Oracles: Python's UTF-8 codec (strict: no overlong forms, no surrogates) and `re` itself.
"""
from __future__ import annotations

import random
import re

import numpy as np
import pytest

from radixlang.runtime.constrained.masks.token_index import walk_rows
from radixlang.runtime.constrained.regex import regex_ast as ra
from radixlang.runtime.constrained.regex import utf8
from radixlang.runtime.constrained.regex.automaton import compile_dfa, own_chars
from radixlang.runtime.constrained.regex.fsa import ConstraintTooLarge, refine
from radixlang.runtime.constrained.regex.regex_parser import parse_regex

CODE_POINTS = np.array([cp for cp in range(ra.MAX_CODE_POINT + 1) if not 0xD800 <= cp <= 0xDFFF])


def as_matrix(strings: list[bytes]) -> tuple[np.ndarray, np.ndarray]:
    """Byte strings as a zero-padded matrix and their lengths."""
    lengths = np.array([len(s) for s in strings])
    flat = np.frombuffer(b"".join(strings), np.uint8)
    matrix = np.zeros((len(strings), max(lengths.max(), 1)), np.int64)
    matrix[np.arange(lengths.max()) < lengths[:, None]] = flat
    return matrix, lengths


def walk(dfa, matrix: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The state each row's bytes lead to from the start (-1: dead), walked vectorised."""
    rows = np.arange(len(lengths))
    return walk_rows(dfa, matrix, lengths, rows, np.zeros(len(rows), np.int64), 0).end_state


def accepted(dfa, matrix: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    end = walk(dfa, matrix, lengths)
    return (end >= 0) & (dfa.accept[np.maximum(end, 0)] >= 0)


@pytest.fixture(scope="module")
def every_character() -> tuple[str, list[bytes], np.ndarray, np.ndarray]:
    """All non-surrogate code points: as text, as UTF-8 strings, and as a byte matrix with lengths."""
    text = "".join(map(chr, CODE_POINTS.tolist()))
    strings = [c.encode() for c in text]
    return text, strings, *as_matrix(strings)


@pytest.mark.parametrize("pattern", [r"\w", r"\W", r"\d", r"\D", r"\s", r"\S", r"[\w\d\s]", r"[^\W\d]", r"(?s:.)",
                                     r"[^\"\\\x00-\x1f]"])
def test_a_class_accepts_exactly_the_code_points_re_puts_in_it(pattern, every_character):
    text, _, matrix, lengths = every_character
    expected = np.zeros(len(text), bool)
    expected[[m.start() for m in re.finditer(pattern, text)]] = True  # text[i] is the i-th non-surrogate
    assert np.array_equal(accepted(compile_dfa([parse_regex(pattern)]), matrix, lengths), expected)


def decodes(data: bytes) -> bool:
    try:
        data.decode()  # strict: no overlong forms, no surrogates
        return True
    except UnicodeDecodeError:
        return False


def test_only_well_formed_utf8_is_read(every_character):
    _, characters, _, _ = every_character
    partial = {e[:k] for e in characters for k in range(1, len(e))}  # unfinished characters

    def alive(data: bytes) -> bool:  # whole characters, then maybe an unfinished one
        return any(decodes(data[:i]) and (i == len(data) or data[i:] in partial) for i in range(len(data) + 1))

    dfa = compile_dfa([parse_regex(r"(?s:.)*")])
    rng = random.Random(0)
    short = [bytes([a]) for a in range(256)] + [bytes([a, b]) for a in range(0xC0, 256) for b in range(256)]
    edgy = [0x00, 0x7F, 0x80, 0x8F, 0x90, 0x9F, 0xA0, 0xBF, 0xC0, 0xFF]
    long = [bytes([lead] + [rng.choice(edgy) if rng.random() < 0.5 else rng.randrange(256) for _ in range(n)])
            for lead in range(0xE0, 0x100) for n in (2, 3) for _ in range(400)]
    strings = short + long
    for data, state in zip(strings, walk(dfa, *as_matrix(strings)).tolist()):
        assert (state >= 0) == alive(data), data
        assert (state >= 0 and dfa.accept[state] >= 0) == decodes(data), data


def test_each_character_reaches_the_label_of_its_first_class(every_character):
    text, _, matrix, lengths = every_character
    dfa = compile_dfa([parse_regex(r"\d"), parse_regex(r"\w"), parse_regex(r"[^\w]")], nonempty=True)
    end = walk(dfa, matrix, lengths)
    assert (end >= 0).all()
    expected = np.full(len(text), 2)
    expected[[m.start() for m in re.finditer(r"\w", text)]] = 1
    expected[[m.start() for m in re.finditer(r"\d", text)]] = 0
    assert np.array_equal(dfa.accept[end], expected)


@pytest.mark.parametrize("pattern", [r"[\w\d\s]{1,16}", r"(é|\w)x|(é|\d)y|中[\w中]", r"(\w|😀)+!|[^a]{2}",
                                     r"[\u0100-\u07ff]é|[\u0800-\uffff]{1,3}|\W\w"])
def test_the_byte_dfa_is_minimal_even_where_decoders_share_tails(pattern):
    dfa = compile_dfa([parse_regex(pattern)])
    assert len(np.unique(refine(dfa.trans, dfa.accept))) == dfa.num_states


@pytest.mark.parametrize("pattern", [r"(é|\w)x|(é|\d)y|中[\w中]", r"[\u0100-\u07ff]é|[\u0800-\uffff]{1,3}|\W\w",
                                     r"[^\"\\\x00-\x1f]{0,40}"])
def test_mid_character_states_interned_by_hash_are_those_interned_by_dict(pattern, monkeypatch):
    """Past a size, mid-character rows are looked up by a hash of each row, checked against the rows kept: from the
    first row on, and with every hash equal, the byte table is the dict's, state for state."""
    chars = own_chars([parse_regex(pattern)], False)
    monkeypatch.setattr(utf8, "_HASHED_FROM", 10**9)
    want = utf8.char_to_byte_dfa(chars)
    assert len(want[0]) > len(chars.trans) + 10, "the pattern should have many mid-character states"
    for hashed_from in (0, 1, 3, 10, 30, 100):  # from the start, or moved from the dict part-way
        monkeypatch.setattr(utf8, "_HASHED_FROM", hashed_from)
        assert all(np.array_equal(a, b) for a, b in zip(utf8.char_to_byte_dfa(chars), want)), hashed_from
    monkeypatch.setattr(utf8, "hash_weights", lambda width: np.zeros(width, np.int64))
    assert all(np.array_equal(a, b) for a, b in zip(utf8.char_to_byte_dfa(chars), want))


@pytest.mark.parametrize("colliding", [False, True])
def test_rows_interned_by_dict_are_found_by_hash_after_the_switch(colliding, monkeypatch):
    """A table past _HASHED_FROM looks its rows up by hash: rows the dict interned before keep their states."""
    monkeypatch.setattr(utf8, "_HASHED_FROM", 4)
    if colliding:
        monkeypatch.setattr(utf8, "hash_weights", lambda width: np.zeros(width, np.int64))
    tails = utf8._Tails(100, 3)
    assert tails._intern(np.array([[1, 2, 3], [4, 5, 6], [1, 2, 3]], np.int32)).tolist() == [100, 101, 100]
    again = np.array([[7, 8, 9], [4, 5, 6], [9, 9, 9], [1, 2, 3]], np.int32)  # 5 rows in all: hashed from here
    assert tails._intern(again).tolist() == [102, 101, 103, 100]
    assert tails._ids is None and tails.rows.tolist() == [[1, 2, 3], [4, 5, 6], [7, 8, 9], [9, 9, 9]]


@pytest.mark.parametrize("pattern", [r"[a-m]x|[n-z]y|[0-9]+", r"[\w\d\s]{1,16}", r"(é|\w)x|(é|\d)y|中[\w中]",
                                     r"[^\"\\\x00-\x1f]*"])
def test_byte_classes_are_the_distinct_columns_of_the_byte_table(pattern):
    """Columns are classes of bytes every state reads alike: no two columns are equal (none wasted), and
    each byte's column is its row of the full table (the `re` tests above walk the table through it)."""
    dfa = compile_dfa([parse_regex(pattern)])
    assert np.unique(dfa.trans, axis=1).shape[1] == dfa.trans.shape[1] < 256
    assert dfa.byte_class.shape == (256,) and set(dfa.byte_class.tolist()) == set(range(dfa.trans.shape[1]))


def test_the_byte_table_bound_counts_states_times_byte_classes(monkeypatch):
    pattern = parse_regex("[^x]{1,50}")
    dfa = compile_dfa([pattern])
    cells = dfa.num_states * dfa.trans.shape[1]
    monkeypatch.setattr(utf8, "MAX_DFA_TRANSITIONS", cells)
    assert compile_dfa([pattern]).num_states == dfa.num_states
    monkeypatch.setattr(utf8, "MAX_DFA_TRANSITIONS", cells - 1)
    with pytest.raises(ConstraintTooLarge, match=f"exceeds {cells - 1} transitions"):
        compile_dfa([pattern])


def test_distinct_rows_number_as_numpy_unique_does():
    rng = np.random.default_rng(0)
    for _ in range(200):
        rows = rng.integers(-1, 3, (int(rng.integers(1, 300)), int(rng.integers(1, 6))))
        number, firsts = utf8._distinct_rows(rows)
        _, want_firsts, want_number = np.unique(rows, axis=0, return_index=True, return_inverse=True)
        assert number.tolist() == want_number.ravel().tolist()
        assert firsts.tolist() == want_firsts.tolist()


def test_splits_group_each_states_multibyte_classes_by_target_as_a_plain_loop_does():
    """_splits (vectorised) against the definition: per state, its live multi-byte classes grouped by target, the
    groups in order of their first class; splits in order of their first state."""
    rng = np.random.default_rng(1)
    for _ in range(200):
        states, classes = int(rng.integers(1, 40)), int(rng.integers(1, 9))
        trans = np.where(rng.random((states, classes)) < 0.5, rng.integers(0, 4, (states, classes)), -1)
        high = np.flatnonzero(rng.random(classes) < 0.7)
        want: dict[tuple, tuple[list[int], list[list[int]]]] = {}
        for state in range(states):
            groups: dict[int, list[int]] = {}
            for c in high.tolist():
                if trans[state, c] >= 0:
                    groups.setdefault(int(trans[state, c]), []).append(c)
            if groups:
                split = tuple(map(tuple, groups.values()))
                want.setdefault(split, ([], []))[0].append(state)
                want[split][1].append(list(groups))
        got = utf8._splits(trans, high)
        assert list(got) == list(want)
        for split, (got_states, got_targets) in got.items():
            assert got_states.tolist() == want[split][0]
            assert got_targets.tolist() == want[split][1]
