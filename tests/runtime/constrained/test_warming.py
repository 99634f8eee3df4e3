"""Masks computed at compile (warming.py): a warmed constraint answers exactly as one that was not (each checked
against brute force at a few states), a decode in the schema's order finds its masks ready, and a lazily built
object warms the declared order before any other."""
from __future__ import annotations

import random

import numpy as np
import pytest

from radixlang.runtime.constrained.compiler import ConstraintCompiler
from radixlang.runtime.constrained.grammar.constraint import GrammarConstraint
from radixlang.runtime.constrained.masks.token_index import TokenIndex
from radixlang.runtime.constrained.matcher import RegexConstraint
from radixlang.runtime.constrained.object_dispatch import ObjectDispatch
from radixlang.runtime.constrained.warming import warm

from .conftest import random_walk
from .test_grammar import assert_brute_force
from .test_object_dispatch import DIGIT, N

LAZY = {"type": "object", "properties": {f"p{i}": DIGIT for i in range(N)}, "additionalProperties": False}
RECURSIVE = {"type": "object", "properties": {"name": {"type": "string"},
                                              "kids": {"type": "array", "items": {"$ref": "#"}}},
             "required": ["name"], "additionalProperties": False}
CASES = {
    "regex": ("regex", r"[a-z]{2,6}-\d{1,3}(,[a-z]{2,6}-\d{1,3}){0,3}", "ab-1,cde-22,f-"[:11]),
    "lazy object": ("json_schema", LAZY, '{"p0":1,"p1":2,"p2":3,"p3":4}'),
    "grammar": ("json_schema", RECURSIVE, '{"name":"a","kids":[{"name":"b","kids":[]}]}'),
}
KINDS = {"regex": RegexConstraint, "lazy object": ObjectDispatch, "grammar": GrammarConstraint}


def compiled(vocab, kind: str, spec, precompute_ms: float = 0):
    return ConstraintCompiler(lambda: vocab, precompute_ms=precompute_ms).compile(kind, spec)


def walks_along(constraint, tokenizer, text: str, monkeypatch) -> int:
    """How many vocabulary walks a decode of `text` token by token runs (0: every mask was ready)."""
    count = [0]
    walk = TokenIndex._walk

    def counted(self, state):
        count[0] += 1
        return walk(self, state)

    monkeypatch.setattr(TokenIndex, "_walk", counted)
    state = constraint.initial()
    for token in tokenizer.encode(text, add_special_tokens=False):
        assert constraint.allowed_bits(state)[token >> 3] >> (token & 7) & 1, (text, token)
        state = constraint.advance(state, token)
    monkeypatch.undo()
    return count[0]


def warmed_for_declared_order(vocab, tokenizer, monkeypatch) -> tuple[ObjectDispatch, int]:
    """LAZY warmed with the least power-of-two budget under which a decode writing its members in declared order
    finds every mask ready, and that budget."""
    declared = '{"p0":1,"p1":2,"p2":3,"p3":4,"p4":5,"p5":6,"p6":7}'
    budget = 16
    while True:
        constraint = compiled(vocab, "json_schema", LAZY)
        warm(constraint, 60.0, max_states=budget)
        if walks_along(constraint, tokenizer, declared, monkeypatch) == 0:
            return constraint, budget
        budget *= 2
        assert budget < 100_000, "the declared order never warmed"


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_warmed_constraint_answers_as_one_not_warmed_and_a_decode_finds_its_masks_ready(case, vocab, tokenizer,
                                                                                           monkeypatch):
    kind, spec, text = CASES[case]
    warmed, cold = compiled(vocab, kind, spec), compiled(vocab, kind, spec)
    assert isinstance(warmed, KINDS[case])
    assert walks_along(warmed, tokenizer, text, monkeypatch) > 0  # not warmed: the decode walks
    warmed = compiled(vocab, kind, spec)
    done = warm(warmed, 60.0, max_states=4000)
    assert 0 < done <= 4000
    assert walks_along(warmed, tokenizer, text, monkeypatch) == 0, case
    rng = random.Random(case)
    for n in range(6):  # random decodes: the warmed masks are the masks
        state, other = warmed.initial(), cold.initial()
        for _ in range(40):
            bits = warmed.allowed_bits(state)
            assert np.array_equal(bits, cold.allowed_bits(other)), (case, n)
            ids = np.flatnonzero(warmed.allowed(state))
            if not len(ids):
                break
            token = int(ids[rng.randrange(len(ids))])
            state, other = warmed.advance(state, token), cold.advance(other, token)
            assert state is not None and other is not None
        if n < 2:  # and against brute force, where a random decode stopped
            assert_brute_force(warmed, state, warmed.allowed(state), vocab, f"{case} {n}")


def test_a_grammar_warming_stopped_inside_its_builds_answers_as_one_never_warmed(vocab, monkeypatch):
    """Warming stops a grammar's lexer or probe build half way at its budget (a deadline raised inside the
    automaton build): whatever it stopped in, the grammar answers as one never warmed, and warms on later."""
    from radixlang.runtime.constrained import deadline
    from radixlang.runtime.constrained.grammar import constraint as grammar_constraint

    calls = [0]

    def stopping(real):
        def build(*args, **kwargs):
            calls[0] += 1
            if calls[0] % 2:  # every other build stops, as a deadline inside it would
                raise deadline.CompileDeadline("the deadline passed")
            return real(*args, **kwargs)
        return build

    stopped = compiled(vocab, "json_schema", RECURSIVE)
    cold = compiled(vocab, "json_schema", RECURSIVE)
    monkeypatch.setattr(GrammarConstraint, "_build_lexer", stopping(GrammarConstraint._build_lexer))
    monkeypatch.setattr(grammar_constraint, "LexerProbe", stopping(grammar_constraint.LexerProbe))
    for _ in range(12):
        warm(stopped, 60.0, max_states=500)
    assert calls[0] >= 12
    monkeypatch.undo()
    assert warm(stopped, 60.0, max_states=500) == 500
    rng = random.Random(1)
    for n in range(8):
        state, other = stopped.initial(), cold.initial()
        for _ in range(40):
            assert np.array_equal(stopped.allowed_bits(state), cold.allowed_bits(other)), n
            ids = np.flatnonzero(stopped.allowed(state))
            if not len(ids):
                break
            token = int(ids[rng.randrange(len(ids))])
            state, other = stopped.advance(state, token), cold.advance(other, token)


def test_a_piece_too_large_met_while_warming_leaves_the_lazily_built_object_whole(vocab, tokenizer, monkeypatch):
    """A lazily built object's piece that fails to build while warming reaches it (ConstraintTooLarge: a keys DFA
    past its bound) stops the warming; the state it was for waits to be built as before, so a decode that reaches
    it builds it, where a row left unbuilt for good would have it ask for the build forever."""
    from radixlang.runtime.constrained.regex.fsa import ConstraintTooLarge

    failed = [0]
    hub_part, build = ObjectDispatch._hub_part, ObjectDispatch._build

    def failing_once(self, *args):
        if not failed[0]:
            failed[0] = 1
            raise ConstraintTooLarge("constraint is too large: injected")
        return hub_part(self, *args)

    builds = [0]

    def counted(self, states):
        builds[0] += 1
        assert builds[0] < 10_000, "a build that never finishes"
        return build(self, states)

    constraint, cold = compiled(vocab, "json_schema", LAZY), compiled(vocab, "json_schema", LAZY)
    monkeypatch.setattr(ObjectDispatch, "_hub_part", failing_once)
    warm(constraint, 60.0, max_states=2000)
    assert failed[0]
    monkeypatch.setattr(ObjectDispatch, "_hub_part", hub_part)
    monkeypatch.setattr(ObjectDispatch, "_build", counted)
    state, other = constraint.initial(), cold.initial()
    for token in tokenizer.encode('{"p0":1,"p1":2,"p3":4}', add_special_tokens=False):
        assert np.array_equal(constraint.allowed_bits(state), cold.allowed_bits(other))
        state, other = constraint.advance(state, token), cold.advance(other, token)
    assert constraint.can_end(state)


def test_warming_stops_at_a_share_of_a_growing_constraints_cache_bound(vocab, monkeypatch):
    """Each lazily built value copy numbers all its states, so warming other member orders could number a table
    past the bound at which the compiler's cache compiles it afresh (at every request, then): it stops at
    WARM_GROWTH_SHARE of the bound, here a small one, and the constraint is not outgrown."""
    import radixlang.runtime.constrained.growing_dfa as growing_dfa
    import radixlang.runtime.constrained.warming as warming

    constraint = compiled(vocab, "json_schema", LAZY)
    monkeypatch.setattr(growing_dfa, "MAX_GROWN_STATES", 4096)
    cap = warming.WARM_GROWTH_SHARE * 4096
    assert len(constraint.unbuilt) < cap
    done = warm(constraint, 60.0)
    assert cap <= len(constraint.unbuilt) < cap + 400 and not constraint.outgrown, (done, len(constraint.unbuilt))
    assert warm(constraint, 60.0) == 0


def test_a_lazily_built_object_warms_the_declared_order_first(vocab, tokenizer, monkeypatch):
    """Models write members in the schema's order (xgrammar and llguidance allow only that one): with a budget
    just large enough for a decode in declared order to find all its masks ready, one writing the same members
    in reverse still walks."""
    reverse = '{"p6":7,"p5":6,"p4":5,"p3":4,"p2":3,"p1":2,"p0":1}'
    constraint, budget = warmed_for_declared_order(vocab, tokenizer, monkeypatch)
    assert walks_along(constraint, tokenizer, reverse, monkeypatch) > 0, budget
    random_walk(constraint, random.Random(0))  # still a working constraint


def test_a_compile_warms_unless_told_not_to_and_keeps_identical_masks_once(vocab):
    """A compile's budget (the engine's constraint_precompute_ms, on by default) warms a small regex whole; 0
    warms nothing. States whose masks are the same (SmolLM2 spells digits one at a time: 30 digits on, the two
    branches differ) share one kept mask."""
    assert ConstraintCompiler(lambda: vocab).precompute_s > 0
    spec = r"a[0-9]{30}x|b[0-9]{30}y"
    warmed = compiled(vocab, "regex", spec, precompute_ms=60_000)  # a budget no machine's load runs past
    cold = compiled(vocab, "regex", spec)
    assert len(warmed.index._states) == len(warmed.dfa.trans) and len(cold.index._states) == 1  # the first mask's
    after_a, after_b = (warmed.dfa.walk(warmed.dfa.start, text) for text in (b"a", b"b"))
    assert after_a != after_b and warmed.index.packed(after_a) is warmed.index.packed(after_b)
    assert np.array_equal(cold.allowed_bits(cold.dfa.walk(cold.dfa.start, b"a")), warmed.index.packed(after_a))
    assert warm(cold, 0.0) == 0


@pytest.mark.parametrize("budget_ms, compile_s, spent_s", [
    (100, 0.01, 0.1), (100, 0.45, 0.05), (100, 0.9, 0.025), (10, 0.9, 0.01), (60_000, 0.9, 59.1)])
def test_a_slow_compile_warms_until_compile_and_warming_reach_the_slow_mark(vocab, monkeypatch, budget_ms,
                                                                            compile_s, spent_s):
    """A quick compile spends its whole budget; one that took long warms only until the two together reach
    config.WARM_SLOW_COMPILE_S (0.5 s), but at least WARM_FLOOR_S (25 ms) and at most the budget; a budget larger
    than the mark stands in for it. The compile's clock is faked: `compile_s` between its start and its first mask."""
    import types

    from radixlang.runtime.constrained import compiler as compiler_module

    spent: list[float] = []
    clock = iter([1000.0, 1000.0 + compile_s])
    monkeypatch.setattr(compiler_module, "time", types.SimpleNamespace(perf_counter=lambda: next(clock)))
    monkeypatch.setattr(compiler_module, "warm", lambda constraint, seconds: spent.append(seconds))
    compiled(vocab, "regex", "a[0-9]", precompute_ms=budget_ms)
    assert spent == [pytest.approx(spent_s)]


def test_a_negative_budget_is_refused():
    from radixlang.runtime.config import EngineConfig

    with pytest.raises(ValueError, match="constraint_precompute_ms"):
        EngineConfig.from_options(None, constraint_precompute_ms=-1)


def test_states_reached_only_through_a_rare_byte_warm_after_every_other(vocab):
    """A model's JSON is mostly ASCII with few escapes: the states only a non-ASCII byte or a backslash leads to (a
    character's middle, an escape's) warm after every state reached without one, however near the start. Oracle:
    the states a breadth-first search reaches over the DFA's other bytes; a budget of that many warms exactly them."""
    constraint = compiled(vocab, "regex", r'"([a-z]{1,3}|\\[nt]|\\u[0-9a-f]{4}|[é-ü]|中)*",[0-9]{1,12}')
    rows = constraint.dfa.trans[:, constraint.dfa.byte_class]  # [states, 256]
    common = np.ones(256, bool)
    common[0x80:] = common[ord("\\")] = False
    seen, todo = {constraint.dfa.start}, [constraint.dfa.start]
    while todo:
        for t in np.unique(rows[todo.pop()][common]).tolist():
            if t >= 0 and t not in seen:
                seen.add(t)
                todo.append(t)
    assert len(rows) - len(seen) >= 6  # the escapes' and characters' middles, nearer the start than the digits' end
    assert warm(constraint, 60.0, max_states=len(seen)) == len(seen)
    assert set(constraint.index._states) == seen


def test_a_keys_first_bytes_warm_after_the_declared_order_where_every_key_they_can_end_skips(vocab, tokenizer,
                                                                                              monkeypatch):
    """Before a key's end, a state takes the fewest members skipped by the keys it can still end: with a budget just
    large enough for a decode in declared order to find its masks ready, `{"p3` (which only `p3`, skipping three
    declared members, ends) is not warmed, while `{"p` (which `p0` ends) is."""
    constraint, _ = warmed_for_declared_order(vocab, tokenizer, monkeypatch)
    assert constraint.index.holds(constraint.advance_bytes(constraint.initial(), b'{"p'))
    for ahead in (b'{"p3', b'{"p6', b'{"p0":1,"p2'):
        assert not constraint.index.holds(constraint.advance_bytes(constraint.initial(), ahead)), ahead


def test_a_hubs_least_skips_are_the_fewest_of_the_finals_each_state_reaches():
    """_least_skips against brute force: each state's least over the finals it reaches (itself included), on random
    DFAs with loops and dead moves."""
    from radixlang.runtime.constrained.object_dispatch import _NO_KEY, _least_skips

    rng = np.random.default_rng(0)
    for _ in range(200):
        n, width = int(rng.integers(1, 12)), int(rng.integers(1, 5))
        trans = np.where(rng.random((n, width)) < 0.4, rng.integers(0, n, (n, width)), -1).astype(np.int32)
        own = np.where(rng.random(n) < 0.3, rng.integers(0, 4, n), _NO_KEY)
        want = []
        for q in range(n):
            seen, todo = {q}, [q]
            while todo:
                for t in trans[todo.pop()].tolist():
                    if t >= 0 and t not in seen:
                        seen.add(t)
                        todo.append(t)
            want.append(min(int(own[t]) for t in seen))
        assert _least_skips(trans, own).tolist() == want, (trans, own)
