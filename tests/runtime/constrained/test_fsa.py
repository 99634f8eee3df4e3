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
    monkeypatch.setattr(fsa, "hash_weights", lambda width: np.zeros(width, np.int64))
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


def random_nfa(rng: np.random.Generator) -> tuple[fsa.Nfa, int, int]:
    """(nfa, start, num_symbols): a small NFA with empty-move cycles, overlapping symbol sets shared by many
    edges (and a few one-off sets, as a bounded repeat writes them), dead ends and several labels."""
    k = int(rng.integers(1, 6))
    n = int(rng.integers(1, 12))
    nfa = fsa.Nfa()
    states = [nfa.new() for _ in range(n)]
    shared = [tuple(sorted(rng.choice(k, int(rng.integers(1, k + 1)), replace=False).tolist())) for _ in range(3)]
    for q in states:
        for t in rng.choice(n, int(rng.integers(0, 3))).tolist():
            nfa.eps[q].append(t)
        for t in rng.choice(n, int(rng.integers(0, 4))).tolist():
            symbols = shared[int(rng.integers(3))] if rng.random() < 0.8 else (int(rng.integers(k)),)
            nfa.edges[q].append((symbols, t))
        if rng.random() < 0.3:
            nfa.accepts[q] = int(rng.integers(3))
    return nfa, int(rng.integers(n)), k


def nfa_labels(nfa: fsa.Nfa, start: int, word: tuple[int, ...]) -> frozenset[int] | None:
    """Brute force: the labels the NFA accepts `word` with (None: no run reads it)."""
    current = fsa.reach(nfa.eps, (start,))
    for c in word:
        current = fsa.reach(nfa.eps, [t for q in current for symbols, t in nfa.edges[q] if c in symbols])
    if not current:
        return None
    return frozenset(nfa.accepts[q] for q in current if q in nfa.accepts)


def python_only(monkeypatch) -> None:
    """fsa's Python paths, as where the native library is not built."""
    monkeypatch.setattr(fsa.native_fsa, "available", lambda: False)


def test_native_subset_construction_is_the_python_one_bit_for_bit(monkeypatch):
    if not fsa.native_fsa.available():
        pytest.skip("no C compiler: the native subset construction is not built")
    rng = np.random.default_rng(0)
    cases = [random_nfa(rng) for _ in range(300)]
    native = [fsa.subsets(*case) for case in cases]
    with monkeypatch.context() as m:
        python_only(m)
        python = [fsa.subsets(*case) for case in cases]
    for (trans, sets), (want_trans, want_sets) in zip(native, python):
        assert trans.dtype == want_trans.dtype and np.array_equal(trans, want_trans)
        assert np.array_equal(sets.ptr, want_sets.ptr) and np.array_equal(sets.members, want_sets.members)


def test_native_lexers_are_the_python_ones(monkeypatch):
    if not fsa.native_fsa.available():
        pytest.skip("no C compiler: the native subset construction is not built")
    from radixlang.runtime.constrained.regex import automaton, regex_parser
    patterns = [[r'"([^"\\]|\\.){0,40}"', r"-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?", "true|false|null"],
                [r"[a-z]+", r"\w{2,5}\d{4}", r"[^\W_]+\s"], [r"(ab|a)*b{1,3}", r"(a|b)*abb"]]
    for sources in patterns:
        nodes = [regex_parser.parse_regex(p) for p in sources]
        alphabet = automaton.alphabet_of(automaton.char_sets(nodes))
        nfa, start = automaton.thompson(nodes, alphabet, nonempty=True)
        got, got_readings = fsa.determinize(nfa, start, len(alphabet.classes), True, readings := []), readings
        with monkeypatch.context() as m:
            python_only(m)
            want, want_readings = fsa.determinize(nfa, start, len(alphabet.classes), True, readings := []), readings
        assert all(np.array_equal(a, b) for a, b in zip(got, want)) and got_readings == want_readings


def test_subset_construction_reads_each_word_as_the_nfa_does(monkeypatch):
    """Against brute force, both paths: the DFA state a word reaches accepts exactly the NFA's labels for it."""
    for native in (True, False):
        with monkeypatch.context() as m:
            if not native:
                python_only(m)
            rng = np.random.default_rng(1)
            for _ in range(60):
                nfa, start, k = random_nfa(rng)
                trans, sets = fsa.subsets(nfa, start, k)
                states, labels = sets.accepted(nfa.accepts)
                accepted = {s: frozenset(labels[states == s].tolist()) for s in range(len(trans))}
                for length in range(4):
                    for word in itertools.product(range(k), repeat=length):
                        s = 0
                        for c in word:
                            s = -1 if s < 0 else int(trans[s, c])
                        want = nfa_labels(nfa, start, word)
                        assert (None if s < 0 else accepted[s]) == want, (native, word)


def test_native_subset_construction_stops_at_the_limit_and_the_deadline(monkeypatch):
    from radixlang.runtime.constrained import deadline
    nfa = fsa.Nfa()
    states = [nfa.new() for _ in range(600)]
    for a, b in zip(states, states[1:]):
        nfa.edges[a].append(((0, 1), b))
    nfa.accepts[states[-1]] = 0
    for native in (True, False):
        with monkeypatch.context() as m:
            if not native:
                python_only(m)
            with pytest.raises(fsa.ConstraintTooLarge, match="its DFA exceeds 599 states"):
                fsa.subsets(nfa, states[0], 2, limit=599)
            assert len(fsa.subsets(nfa, states[0], 2, limit=600)[0]) == 600
            with deadline.limit(1e-9), pytest.raises(deadline.CompileDeadline):
                fsa.subsets(nfa, states[0], 2)


def test_native_trim_and_minimize_are_the_python_ones(monkeypatch):
    """Random DFAs, small and dense (cycles everywhere) or layered and wide (acyclic heights of 40 states, a
    few with a loop back): the native live states and finite classes give the Python path's DFA."""
    if not fsa.native_fsa.available():
        pytest.skip("no C compiler: the native loops are not built")
    rng = np.random.default_rng(2)
    cases = []
    for i in range(200):
        n, k = int(rng.integers(1, 14)), int(rng.integers(1, 4))
        dead = rng.random() * 0.8
        trans = np.where(rng.random((n, k)) < dead, -1, rng.integers(0, n, (n, k)))
        cases.append((trans, np.where(rng.random(n) < 0.3, rng.integers(0, 3, n), -1)))
    for i in range(6):
        width, depth = 40, 5
        layer = np.arange(width * depth) // width
        nxt = (layer[:, None] + 1) * width + rng.integers(0, 4, (width * depth, 2))
        trans = np.where((layer[:, None] < depth - 1) & (rng.random((width * depth, 2)) < 0.7), nxt, -1)
        if i % 2:
            trans[-1, 0] = 0
        cases.append((trans, np.where(rng.random(width * depth) < 0.2, rng.integers(0, 2, width * depth), -1)))
    native = [fsa.minimize(*fsa.trim(trans, labels)) for trans, labels in cases]
    python_only(monkeypatch)
    for (trans, labels), got in zip(cases, native):
        want = fsa.minimize(*fsa.trim(trans, labels))
        assert all(np.array_equal(a, b) for a, b in zip(got, want))
