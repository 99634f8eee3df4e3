"""Symbol-level automata: partition refinement and row ids against brute force."""
from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from radixlang.runtime.constrained.regex import fsa


@st.composite
def dfas(draw, max_states: int = 9, max_symbols: int = 3):
    """(trans, labels): random DFAs with dead transitions and a few labels."""
    n = draw(st.integers(1, max_states))
    k = draw(st.integers(1, max_symbols))
    trans = np.array(draw(st.lists(st.integers(-1, n - 1), min_size=n * k, max_size=n * k))).reshape(n, k)
    labels = np.array(draw(st.lists(st.integers(-1, 1), min_size=n, max_size=n)))
    return trans, labels


def behaviour(trans: np.ndarray, labels: np.ndarray, state: int, depth: int) -> tuple:
    """What `state` does on every string of at most `depth` symbols: dead, or the label reached."""
    out = []
    for length in range(depth + 1):
        for word in itertools.product(range(trans.shape[1]), repeat=length):
            s = state
            for c in word:
                s = -1 if s < 0 else int(trans[s, c])
            out.append(None if s < 0 else int(labels[s]))
    return tuple(out)


def same_partition(ids, keys) -> bool:
    """Whether `ids` are equal exactly where `keys` are."""
    n = len(keys)
    return all((ids[i] == ids[j]) == (keys[i] == keys[j]) for i in range(n) for j in range(n))


@settings(max_examples=300, deadline=None)
@given(dfas(), st.integers(0, 4))
def test_bounded_refinement_groups_states_that_agree_on_all_short_strings(dfa, rounds):
    trans, labels = dfa
    truth = [behaviour(trans, labels, s, rounds) for s in range(len(trans))]
    assert same_partition(fsa.refine(trans, labels, rounds), truth)


@settings(max_examples=200, deadline=None)
@given(dfas(max_states=7, max_symbols=2))
def test_full_refinement_is_language_equivalence(dfa):
    trans, labels = dfa
    truth = [behaviour(trans, labels, s, len(trans)) for s in range(len(trans))]  # n symbols tell states apart
    assert same_partition(fsa.refine(trans, labels), truth)


@settings(max_examples=200, deadline=None)
@given(dfas())
def test_minimize_keeps_each_states_language_and_leaves_no_equivalent_pair(dfa):
    trans, labels = dfa
    small, small_labels = fsa.minimize(trans, labels)
    depth = len(trans)
    assert behaviour(small, small_labels, 0, depth) == behaviour(trans, labels, 0, depth)
    assert len(np.unique(fsa.refine(small, small_labels))) == len(small)


@settings(max_examples=300, deadline=None)
@given(dfas(max_states=12))
def test_minimize_merges_exactly_what_plain_refinement_does(dfa):
    trans, labels = dfa  # untrimmed: states that cannot accept, dead loops, finite and cyclic parts
    small, _ = fsa.minimize(trans, labels)
    assert len(small) == len(np.unique(fsa.refine(trans, labels)))


def test_minimize_folds_two_copies_of_a_long_chain_into_one():
    # states 2i and 2i + 1 read one symbol to 2i + 2 / 2i + 3; the last pair accept and loop back to
    # the start on symbol 1, so the chain is acyclic only in the copy without that loop
    n = 600
    trans = np.full((n, 2), -1)
    trans[np.arange(n - 2), 0] = np.arange(2, n)
    labels = np.full(n, -1)
    labels[n - 2:] = 0
    small, small_labels = fsa.minimize(trans, labels)
    assert len(small) == n // 2
    trans[n - 2, 1] = 0
    small, small_labels = fsa.minimize(trans, labels)
    assert len(small) == n
    assert behaviour(small, small_labels, 0, 3) == behaviour(trans, labels, 0, 3)


@pytest.mark.parametrize("seed", range(6))
def test_minimize_merges_exactly_what_plain_refinement_does_on_wide_acyclic_layers(seed):
    # layers of 40 states (wide enough to be classed as rows at once), each reading into the next
    # layer or nowhere, with a few labels; some seeds add a loop back, so part of it reaches a cycle
    rng = np.random.default_rng(seed)
    width, depth, symbols = 40, 6, 3
    n = width * depth
    layer = np.arange(n) // width
    nxt = (layer[:, None] + 1) * width + rng.integers(0, 4, (n, symbols))  # few targets: many equal rows
    trans = np.where((layer[:, None] < depth - 1) & (rng.random((n, symbols)) < 0.7), nxt, -1)
    labels = np.where(rng.random(n) < 0.2, rng.integers(0, 2, n), -1)
    if seed % 2:
        trans[n - 1, 0] = 0
    small, small_labels = fsa.minimize(trans, labels)
    assert len(small) == len(np.unique(fsa.refine(trans, labels)))
    assert behaviour(small, small_labels, 0, depth) == behaviour(trans, labels, 0, depth)


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(-2, 2), min_size=3, max_size=3), min_size=1, max_size=30))
def test_row_ids_are_equal_exactly_where_rows_are(rows):
    ids = fsa.row_ids(np.array(rows))
    assert same_partition(ids, rows)
    assert sorted(set(ids.tolist())) == list(range(len(set(map(tuple, rows)))))  # dense


def test_row_ids_stay_exact_when_every_hash_collides(monkeypatch):
    monkeypatch.setattr(fsa, "_hash_weights", lambda width: np.zeros(width, np.int64))
    rows = np.array([[1, 2], [2, 1], [1, 2], [0, 0]])
    assert fsa.row_ids(rows).tolist() == [1, 2, 1, 0]


def test_subset_construction_refuses_more_than_the_state_limit(monkeypatch):
    monkeypatch.setattr(fsa, "MAX_DFA_STATES", 3)
    nfa = fsa.Nfa()
    states = [nfa.new() for _ in range(5)]
    for a, b in zip(states, states[1:]):
        nfa.edges[a].append(((0,), b))
    nfa.accepts[states[-1]] = 0
    with pytest.raises(ValueError, match="exceeds 3 states"):
        fsa.determinize(nfa, states[0], 1)
