"""Merged container bodies (json_unions): one deterministic graph over member letters reading the union.

Oracle: the bodies' languages over their letters (rule references), enumerated by brute force up to a length.
"""
from __future__ import annotations

import itertools

import pytest

from radixlang.runtime.constrained.jsonschema.json_unions import merged_body
from radixlang.runtime.constrained.regex import regex_ast as ra

A, B, C = ra.Ref("a"), ra.Ref("b"), ra.Ref("c")
MAX_LETTERS = 5


def words(node: ra.Node) -> set[tuple[str, ...]]:
    """The body's letter strings of at most MAX_LETTERS letters."""
    if isinstance(node, ra.Ref):
        return {(node.name,)}
    if isinstance(node, ra.Seq):
        out = {()}
        for item in node.items:
            out = {w + v for w in out for v in words(item) if len(w + v) <= MAX_LETTERS}
        return out
    if isinstance(node, ra.Alt):
        return set().union(*(words(item) for item in node.items))
    assert isinstance(node, ra.Repeat)
    item, out, power = words(node.item), set(), {()}
    for count in range(MAX_LETTERS + 1 if node.max is None else node.max + 1):
        if count >= node.min:
            out |= power
        power = {w + v for w in power for v in item if len(w + v) <= MAX_LETTERS}
    return out


def graph_words(graph: ra.Graph) -> set[tuple[str, ...]]:
    out, layer = set(), {((), 0)}
    for _ in range(MAX_LETTERS + 1):
        out |= {w for w, q in layer if q in graph.finals}
        layer = {(w + (label.name,), dst) for w, q in layer for src, label, dst in graph.edges if src == q}
    return out


@pytest.mark.parametrize("bodies", [
    [ra.seq(A, ra.repeat(B, 0, None)), ra.alt(ra.EMPTY, ra.seq(A, C)), ra.repeat(ra.seq(A, B), 0, 2)],
    [ra.seq(A, ra.optional(B)), ra.seq(A, ra.optional(C))],  # both end after "a"
    [ra.repeat(A, 1, 3), ra.seq(ra.repeat(A, 0, 2), ra.optional(B))],
])
def test_the_merged_graph_reads_exactly_the_union_deterministically(bodies):
    graph = merged_body(bodies)
    assert graph is not None
    assert graph_words(graph) == set().union(*map(words, bodies))
    labels = [(src, label) for src, label, _ in graph.edges]
    assert len(labels) == len(set(labels))  # deterministic: one edge per state and letter


@pytest.mark.parametrize("bodies", [[A, B], [ra.seq(A, B), ra.seq(A, C)], [ra.repeat(A, 1, None), ra.EMPTY]])
def test_bodies_that_never_end_together_are_not_merged(bodies):
    assert not any(len(set(w) & set(v)) for w, v in itertools.combinations(map(words, bodies), 2))  # the premise
    assert merged_body(bodies) is None


def test_a_merge_over_its_state_bound_is_left_as_separate_alternatives(monkeypatch):
    from radixlang.runtime.constrained.jsonschema import json_unions

    bodies = [ra.seq(A, ra.optional(B)), ra.seq(A, ra.optional(C))]
    states = merged_body(bodies).num_states
    monkeypatch.setattr(json_unions, "MAX_MERGED_STATES", states)
    assert merged_body(bodies) is not None
    monkeypatch.setattr(json_unions, "MAX_MERGED_STATES", states - 1)
    assert merged_body(bodies) is None


def test_bodies_linked_once_and_pasted_make_the_graphs_linking_them_each_time_makes():
    """The schema compiler keeps each body's NFA (LinkedBody) across merged_body's tries (a union that does
    not merge is tried again without its first member): the graphs equal those built from scratch."""
    shared = ra.seq(A, ra.repeat(ra.seq(B, ra.optional(C)), 0, 3))
    bodies = [ra.seq(A, ra.optional(B)), shared, ra.alt(ra.EMPTY, ra.seq(A, C)), ra.repeat(ra.seq(A, B), 0, 2),
              ra.seq(shared, ra.optional(A))]
    linked: dict = {}
    for start in range(len(bodies) - 1):
        for group in (bodies[start:], bodies[start:][::-1]):
            fresh = merged_body(group)
            assert merged_body(group, linked) == fresh
            if fresh is not None:
                assert graph_words(fresh) == set().union(*map(words, group))
    assert set(linked) == set(bodies)
