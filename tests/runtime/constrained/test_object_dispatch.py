"""Objects too large for an eager any-order automaton take any order, built lazily (object_dispatch),
against the `jsonschema` library: random objects (members in any order, some twice, undeclared ones,
nested large objects) are accepted exactly when valid with unique keys (undeclared members anywhere),
and random walks of the token masks end in valid objects."""
from __future__ import annotations

import gc
import itertools
import json
import random
import weakref

import jsonschema
import numpy as np

from radixlang.runtime.constrained.compiler import ConstraintCompiler
from radixlang.runtime.constrained.jsonschema.json_objects import ANY_ORDER_MAX_PROPERTIES
from radixlang.runtime.constrained.object_dispatch import ObjectDispatch

from .test_grammar import assert_brute_force
from .test_json_schema import complete_outputs
from .test_json_schema_keywords import accepts
from .test_json_schema_semantics import unique_keys

N = ANY_ORDER_MAX_PROPERTIES + 4  # 2^10 sets of members written: a decode builds the few it visits
DIGIT = {"type": "integer", "minimum": 0, "maximum": 9}
INNER = {"type": "object", "properties": {f"q{i}": DIGIT for i in range(N)}, "required": ["q1"],
         "additionalProperties": False}
OUTER = {"type": "object", "properties": {**{f"p{i}": DIGIT for i in range(N - 2)}, "kid": INNER,
                                          "kids": {"type": "array", "items": INNER}},
         "required": ["p0", "p5"], "additionalProperties": {"type": "string"}}


def random_object(rng: random.Random, schema: dict) -> str:
    """An object of `schema` in random member order, mostly valid: now and then a required member is
    missing, one is written twice, or a value has the wrong type."""
    props, required = schema["properties"], schema["required"]
    keys = required + rng.sample([k for k in props if k not in required], rng.randint(0, 5))
    keys += ["x"] if rng.random() < 0.4 else []
    rng.shuffle(keys)
    if rng.random() < 0.1:
        keys.remove(rng.choice(keys))
    if rng.random() < 0.1:
        keys.insert(rng.randrange(len(keys) + 1), rng.choice(keys))
    return "{" + ",".join(f'"{k}":' + random_value(rng, props.get(k)) for k in keys) + "}"


def random_value(rng: random.Random, schema: dict | None) -> str:
    if rng.random() < 0.05:
        return '"wrong"' if schema == DIGIT else "7"
    if schema is None:  # undeclared: a string
        return '"s"'
    if schema == DIGIT:
        return str(rng.randrange(10))
    if schema == INNER:
        return random_object(rng, INNER)
    return "[" + ",".join(random_object(rng, INNER) for _ in range(rng.randint(0, 2))) + "]"


def masks_along(constraint: ObjectDispatch, vocab, text: str, brute_at: tuple[int, ...] = ()) -> list[np.ndarray]:
    """The mask at each byte of `text` (which the constraint must accept), checked against brute force at the
    bytes `brute_at`."""
    out, state = [], constraint.initial()
    for i, byte in enumerate(text.encode()):
        out.append(constraint.allowed(state))
        if i in brute_at:
            assert_brute_force(constraint, state, out[-1], vocab, text[:i])
        state = constraint.advance_bytes(state, bytes([byte]))
        assert state is not None, text[:i + 1]
    assert constraint.can_end(state)
    return out


def test_large_objects_take_any_order_exactly_as_jsonschema_says(compiler):
    constraint = compiler.compile("json_schema", OUTER)
    assert isinstance(constraint, ObjectDispatch) and constraint.unenforced == ()
    validator = jsonschema.Draft202012Validator(OUTER)
    rng, valid_seen = random.Random(0), 0
    for _ in range(150):
        text = random_object(rng, OUTER)
        valid = unique_keys(text) and validator.is_valid(json.loads(text))
        valid_seen += valid
        assert accepts(constraint, text) == valid, text
    assert 25 < valid_seen < 125, "the sample should hold valid and invalid objects"
    # required members last, nested objects out of declared order
    assert accepts(constraint, '{"kid":{"q9":1,"q1":2},"kids":[{"q1":0},{"q3":1,"q1":1}],"p5":1,"p0":2,"x":"s"}')


def test_a_dropped_table_is_freed_by_its_last_reference_not_left_to_the_cyclic_collector(vocab):
    """A lazily built table keeps, for each row still waiting, where that row comes from. Kept as methods bound to
    the table, they made it a reference cycle: a constraint evicted from the compiler's cache lived on, its tables
    with it, until the cyclic collector ran, in whichever request's thread that was (before: 66 of 145 schemas of
    JSONSchemaBench left cyclic garbage, up to 3,100 objects each; now none)."""
    compiler = ConstraintCompiler(lambda: vocab)  # its own cache, which this test empties
    constraint = compiler.compile("json_schema", OUTER)
    assert isinstance(constraint, ObjectDispatch)
    assert accepts(constraint, '{"kid":{"q9":1,"q1":2},"kids":[{"q1":0}],"p5":1,"p0":2,"x":"s"}')
    assert constraint._pending and constraint._hubs, "hubs built, rows still waiting on their targets"
    freed = weakref.ref(constraint)
    gc.disable()
    try:
        del constraint, compiler
        assert freed() is None
    finally:
        gc.enable()


def test_random_walks_of_the_masks_end_in_valid_objects(compiler, walk):
    """Closed objects (an undeclared key's random string would rarely close), one inside the other."""
    schema = {"type": "object", "properties": {**{f"p{i}": DIGIT for i in range(N - 1)}, "kid": INNER},
              "required": ["kid"], "additionalProperties": False}
    constraint = compiler.compile("json_schema", schema)
    assert isinstance(constraint, ObjectDispatch)
    for text in complete_outputs(constraint, walk, seed=3, wanted=6, max_tokens=400):
        jsonschema.validate(json.loads(text), schema)
        assert unique_keys(text), text


def test_an_object_that_starts_like_another_is_not_lazy(compiler):
    """anyOf of a large object and another object: both start with a brace where the marker is read, so the
    large one cannot be lazy; the schema compiles as a grammar instead, where it takes any order too (checked
    by the parser: json_checked), nothing reported; against jsonschema."""
    schema = {"anyOf": [INNER, {"type": "object", "properties": {"z": DIGIT}, "required": ["z"],
                                "additionalProperties": False}]}
    constraint = compiler.compile("json_schema", schema)
    assert not isinstance(constraint, ObjectDispatch) and not constraint.unenforced
    validator = jsonschema.Draft202012Validator(schema)
    for text in ('{"z":1}', '{"q1":1,"q2":2}', '{"q2":2,"q1":1}', '{"q2":2}', '{"z":1,"q1":1}'):
        assert accepts(constraint, text) == validator.is_valid(json.loads(text)), text


def test_a_cached_constraint_grown_past_its_bound_is_compiled_afresh(compiler, monkeypatch):
    """Each decode builds the member sets it visits; the cache hands out a grown table only up to a bound,
    so a long-lived server does not keep the whole exact automaton."""
    import radixlang.runtime.constrained.growing_dfa as growing_dfa

    monkeypatch.setattr(compiler, "precompute_s", 0)  # sizes as compiled: warming's depend on the clock
    schema = {**OUTER, "required": ["p0", "p6"]}  # not cached by the tests above
    first = compiler.compile("json_schema", schema)
    assert compiler.compile("json_schema", schema) is first
    size = len(first.unbuilt)
    assert accepts(first, '{"p6":1,"p0":2,"kid":{"q1":2}}') and len(first.unbuilt) > size  # it grew
    monkeypatch.setattr(growing_dfa, "MAX_GROWN_STATES", size)
    fresh = compiler.compile("json_schema", schema)
    assert fresh is not first and len(fresh.unbuilt) == size
    assert compiler.compile("json_schema", schema) is fresh
    assert accepts(first, '{"p0":2,"p6":1}') and accepts(fresh, '{"p0":2,"p6":1}')  # the old one still works


def test_objects_that_cannot_be_lazy_take_any_order_in_a_grammar_compiled_once_more(compiler, monkeypatch):
    """Two members each an anyOf of a large object and a small one (both start with a brace): the lazy try
    fails, and the schema compiles once more, as a grammar whose large objects all take any order (checked by
    the parser), the third one's too: two compiles, not one per object, nothing reported. Before, those objects
    kept declared order (a valid text written in another order was refused). The language against jsonschema."""
    import radixlang.runtime.constrained.compiler as compiler_module

    calls = []
    real = compiler_module.compile_json_schema
    monkeypatch.setattr(compiler_module, "compile_json_schema", lambda *a, **k: calls.append(1) or real(*a, **k))
    small = {"type": "object", "properties": {"z": DIGIT}, "required": ["z"], "additionalProperties": False}
    schema = {"type": "object", "properties": {
        "a": {"anyOf": [{**INNER, "required": ["q2"]}, small]}, "b": {"anyOf": [{**INNER, "required": ["q3"]}, small]},
        "c": INNER}, "required": ["a", "b", "c"], "additionalProperties": False}
    constraint = compiler.compile("json_schema", schema)
    assert not isinstance(constraint, ObjectDispatch) and len(calls) == 2
    assert not constraint.unenforced
    validator = jsonschema.Draft202012Validator(schema)
    for text in ('{"a":{"q2":1,"q4":2},"b":{"z":1},"c":{"q9":0,"q1":1}}',  # c out of order
                 '{"c":{"q1":1},"b":{"q3":1},"a":{"z":2}}',
                 '{"a":{"q4":2,"q2":1},"b":{"z":1},"c":{"q1":1}}',  # a out of declared order: accepted now
                 '{"a":{"q2":1},"b":{"q2":1},"c":{"q1":1}}',  # b lacks q3: invalid
                 '{"a":{"q2":1,"z":1},"b":{"z":1},"c":{"q1":1}}'):  # a mixes both branches: invalid
        assert accepts(constraint, text) == validator.is_valid(json.loads(text)), text


def test_the_first_clash_ends_the_lazy_try_and_a_failed_grammar_still_learns_every_clash(compiler, monkeypatch):
    """Till the any-order grammar is tried, the lazy try stops at its first clash (`first_clash`: it names what it
    found, `complete` False); where that grammar fails, the compiler asks for every clash, so the rounds after take
    them all out at once, as without the early stop: the same compiles, and the language against jsonschema."""
    import radixlang.runtime.constrained.compiler as compiler_module
    from radixlang.runtime.constrained.jsonschema.json_schema import compile_json_schema
    from radixlang.runtime.constrained.object_dispatch import NotLazy

    small = {"type": "object", "properties": {"z": DIGIT}, "required": ["z"], "additionalProperties": False}
    schema = {"type": "object", "properties": {  # large: a and b clash in parts of their own
        **{f"p{i}": DIGIT for i in range(N - 2)}, "a": {"anyOf": [{**INNER, "required": ["q4"]}, small]},
        "b": {"anyOf": [{**INNER, "required": ["q5"]}, small]}, "c": INNER},
        "required": ["a", "b", "c"], "additionalProperties": False}
    grammar = compile_json_schema(schema, None, frozenset({"uniqueItems"}), lazy_objects=True)
    found = {}
    for first in (True, False):
        try:
            ObjectDispatch(grammar.root, grammar.lazy, compiler.vocab, grammar.any_level, first_clash=first)
        except NotLazy as e:
            found[first] = e
    assert not found[True].complete and found[False].complete
    assert found[True].paths and found[True].paths < found[False].paths  # a and b clash: it stopped at one

    monkeypatch.setattr(compiler_module.ConstraintCompiler, "_any_order_grammar", lambda self, make: None)
    calls = []
    real = compiler_module.compile_json_schema
    monkeypatch.setattr(compiler_module, "compile_json_schema", lambda *a, **k: calls.append(1) or real(*a, **k))
    constraint = compiler.compile("json_schema", schema)
    # the lazy try, then one more with a and b in declared order: as many as when every clash was named at once
    assert isinstance(constraint, ObjectDispatch) and len(calls) == 2
    assert any(r.startswith("property order") for r in constraint.unenforced)  # a's and b's large objects
    validator = jsonschema.Draft202012Validator(schema)
    for text in ('{"a":{"q1":2,"q4":1},"b":{"z":1},"c":{"q9":0,"q1":1}}', '{"c":{"q1":1},"b":{"q1":1,"q5":1},"a":{"z":2}}',
                 '{"a":{"q1":1},"b":{"z":1},"c":{"q1":1}}', '{"a":{"z":1},"b":{"z":1},"c":{"q2":1}}'):
        assert accepts(constraint, text) == validator.is_valid(json.loads(text)), text


def test_a_lazy_try_that_meets_a_rule_compiles_as_a_grammar(compiler):
    """A recursive schema (a grammar) holding a large object: the lazy try stops at the first rule and the
    schema compiles without lazy objects (the large one in any order, checked by the grammar: json_checked),
    against jsonschema."""
    schema = {"type": "object", "properties": {"big": INNER, "kids": {"type": "array", "items": {"$ref": "#"}}},
              "additionalProperties": False}
    constraint = compiler.compile("json_schema", schema)
    assert not isinstance(constraint, ObjectDispatch)
    assert constraint.unenforced == ()
    validator = jsonschema.Draft202012Validator(schema)
    for text in ('{"big":{"q1":1,"q4":2},"kids":[{"kids":[{"big":{"q1":0}}]}]}', '{"kids":[{},{"big":{"q1":3}}]}',
                 '{"kids":[{"big":{"q4":2,"q1":1}}]}', '{"kids":[{"big":{"q4":2}}]}', '{"kids":[{"x":1}]}'):
        assert accepts(constraint, text) == validator.is_valid(json.loads(text)), text


def test_masks_in_bounded_strings_of_a_lazily_built_table_match_brute_force(compiler):
    """A lazily built table's bounded strings skip their run (the bytes that all lead on, for as many bytes as
    the bound leaves: the walk stops it before an unbuilt row, whose placeholder must not be read), with the
    run's tokens kept per byte set up to its longest token: the mask at states far from the bound, near it and
    around the members (hubs built as reached), equals each token's bytes fed one at a time."""
    bounded = {"type": "string", "maxLength": 24}
    schema = {"type": "object", "properties": {**{f"p{i}": DIGIT for i in range(N - 2)}, "a": bounded,
                                               "b": {"type": "string", "maxLength": 12}},
              "required": ["a"], "additionalProperties": False}
    constraint = compiler.compile("json_schema", schema)
    assert isinstance(constraint, ObjectDispatch)
    vocab = constraint.vocab
    text = '{"p3":1,"a":"abcdefghijklmnopqrstuvwx","b":"hello world!"}'
    checked, runs = 0, []
    state = constraint.initial()
    for i, b in enumerate(text.encode()):
        if i in (9, 13, 14, 20, 30, 34, 36, 37, 41, 46, 52):
            assert_brute_force(constraint, state, constraint.allowed(state), vocab, text[:i])
            if vocab.native_trie is not None:
                runs.append(constraint.index._walker(vocab.native_trie)._skip_set(state, False)[1])
            checked += 1
        state = constraint.advance_bytes(state, bytes([b]))
        assert state is not None, text[:i + 1]
    assert constraint.can_end(state) and checked == 11
    assert vocab.native_trie is None or max(runs) >= 16, ("the strings' runs are skipped", runs)


def test_values_laid_in_two_runs_give_the_masks_of_values_laid_whole(vocab, monkeypatch):
    """A value's copy lays its first VALUE_HEAD_BYTES bytes' states, and the rest a stretch at a time when a walk
    first reaches one (most copies, reached by a mask walk a few bytes past a key, stay partly unlaid; a long
    bounded string is laid only as far as the decode reads, plus a token): along a walk through long values
    (enums, a small object in any order, a bounded string read through several stretches) the masks equal those
    of the same table laid whole, and each token's bytes fed one at a time at a few states; the table left rests
    unlaid, the bounded string's among them."""
    import radixlang.runtime.constrained.object_dispatch as object_dispatch
    from radixlang.runtime.constrained.compiler import ConstraintCompiler

    person = {"type": "object", "properties": {"first_name": {"type": "string"}, "last_name": {"type": "string"},
                                               "age": DIGIT}, "additionalProperties": False}
    schema = {"type": "object", "properties": {
        **{f"p{i}": DIGIT for i in range(N - 3)}, "order": {"enum": ["alphabetical", "chronological", "numerical"]},
        "who": person, "note": {"type": "string", "maxLength": 400}}, "required": ["who"],
        "additionalProperties": {"enum": ["alphabetical", "chronological"]}}  # an undeclared key's `":` leads into it
    # not warmed (warming.py): it lays stretches too, and the test asks which rests a decode leaves unlaid
    split = ConstraintCompiler(lambda: vocab, precompute_ms=0).compile("json_schema", schema)
    whole = ConstraintCompiler(lambda: vocab, precompute_ms=0).compile("json_schema", schema)
    assert isinstance(split, ObjectDispatch) and isinstance(whole, ObjectDispatch)
    note = "first computer, " * 10  # 160 bytes: past the first stretch, short of the bound
    text = ('{"p2":3,"order":"chronological","who":{"last_name":"Lovelace","age":5,"first_name":"Ada"},'
            f'"note":"{note}","x":"alphabetical","p0":1}}')
    # a key's start, in the enum, in the nested object, in the note (early, late), the undeclared key
    masks = masks_along(split, vocab, text, brute_at=(8, 17, 40, 101, 200, 260))
    monkeypatch.setattr(object_dispatch, "VALUE_HEAD_BYTES", 10_000)  # values split from here on: laid whole
    for i, mask in enumerate(masks_along(whole, vocab, text)):
        assert np.array_equal(masks[i], mask), (text[:i], np.flatnonzero(masks[i] != mask)[:5])
    assert split._rests and not whole._rests, "copies reached only by mask walks keep their rest unlaid"
    laid = [(len(part.trans), upto) for part, _, upto in split._rests.values()]
    assert any(n > 2000 and len(note) < upto < 400 for n, upto in laid), ("the note is laid as far as read", laid)


def test_a_decode_inside_a_value_lays_ahead_and_its_walks_stop_at_no_unbuilt_row(vocab, monkeypatch):
    """A decode's own state inside a value copy lays the copy's next stretch, and builds the hub after the value,
    before its walk (_before_walk): otherwise that walk stops at an unbuilt row, voided, and is walked again (~1
    ms of a bounded string's first mask). Through a long bounded string (past its first stretch) and a number, no
    walk from the decode's state stops at an unbuilt row of its value (its rest, or its finals waiting on the hub;
    a token may still read on into the hub's keys), and the masks there equal brute force at a few states."""
    from radixlang.runtime.constrained.compiler import ConstraintCompiler
    from radixlang.runtime.constrained.masks import token_index

    members = {**{f"p{i}": DIGIT for i in range(N - 2)}, "note": {"type": "string", "maxLength": 300},
               "size": {"type": "number"}}
    schema = {"type": "object", "properties": members, "additionalProperties": False}
    # not warmed (warming.py): it walks these states before the decode does
    constraint = ConstraintCompiler(lambda: vocab, precompute_ms=0).compile("json_schema", schema)
    assert isinstance(constraint, ObjectDispatch)
    voided: list[np.ndarray] = []
    walk = token_index.TokenIndex._walk

    def counted(index: token_index.TokenIndex, state: int):  # type: ignore[no-untyped-def]
        try:
            return walk(index, state)
        except token_index.Unbuilt as e:
            voided.append(e.states)
            raise

    monkeypatch.setattr(token_index.TokenIndex, "_walk", counted)
    note = "a note long enough, " * 6  # 120 bytes: past the first stretch
    text = f'{{"p1":2,"note":"{note}","size":12.5}}'
    values = [*range(text.index(note), text.index(note) + len(note)), *range(text.index("12.5"), text.index("}"))]
    state = constraint.initial()
    for i, byte in enumerate(text.encode()):
        voided.clear()
        mask = constraint.allowed(state)
        if i in values:
            offset = constraint._copy_of(state)
            assert offset is not None, "inside a value"
            inside = [q for states in voided for q in states.tolist()
                      if offset <= q < offset + len(constraint._copies[offset].trans)]
            assert not inside, (text[:i], inside)
        if i in (values[0], values[50], values[-4]):  # the note's start, inside it, the number's start
            assert_brute_force(constraint, state, mask, vocab, text[:i])
        state = constraint.advance_bytes(state, bytes([byte]))
        assert state is not None, text[:i + 1]
    assert constraint.can_end(state)


def test_common_classes_is_the_coarsest_partition_refining_each():
    """Two bytes share a column exactly where they share a class in every piece (pairs checked one by one),
    columns numbered by their first byte; repeated pieces change nothing."""
    from radixlang.runtime.constrained.object_dispatch import common_classes

    rng = np.random.default_rng(1)
    for _ in range(20):
        pieces = [rng.integers(0, int(rng.integers(1, 40)), 256) for _ in range(int(rng.integers(1, 5)))]
        out = common_classes(*pieces, *pieces[:1])
        same = np.all([p[:, None] == p[None, :] for p in pieces], axis=0)
        assert np.array_equal(out[:, None] == out[None, :], same)
        firsts = [int(np.flatnonzero(out == k)[0]) for k in range(int(out.max()) + 1)]
        assert firsts == sorted(firsts) and out[0] == 0


def test_a_table_over_byte_classes_refined_by_a_later_piece_gives_the_masks_of_one_never_refined(vocab, monkeypatch):
    """The table's rows are over its columns (the bytes every piece known at its start reads alike), not 256
    bytes; a keys DFA built later that tells apart bytes of one column refines the columns (_admit: the laid and
    waiting rows copied over the finer columns, the index moved). With no keys DFA built up front, a decode
    through nested objects refines the table, and at every byte its masks equal those of a table whose keys DFAs
    were all built up front (never refined), and brute force at a few bytes; every piece laid reads each
    column's bytes alike."""
    import radixlang.runtime.constrained.object_dispatch as object_dispatch
    from radixlang.runtime.constrained.compiler import ConstraintCompiler

    text = '{"p5":1,"kid":{"q3":4,"q1":2},"p0":7,"xyz":"hi","kids":[{"q1":0,"q9":5}],"p2":3}'
    monkeypatch.setattr(object_dispatch, "EAGER_KEYS_MAX", 10_000)
    whole = ConstraintCompiler(lambda: vocab, precompute_ms=0).compile("json_schema", OUTER)
    assert isinstance(whole, ObjectDispatch)
    width = whole._trans.shape[1]
    assert width < 128, width  # the point: rows far narrower than 256 bytes
    monkeypatch.setattr(object_dispatch, "EAGER_KEYS_MAX", 0)
    refined = ConstraintCompiler(lambda: vocab, precompute_ms=0).compile("json_schema", OUTER)
    assert isinstance(refined, ObjectDispatch)
    narrow = refined._trans.shape[1]
    assert narrow < width, "no keys DFA known at the start: fewer columns"
    masks = masks_along(refined, vocab, text, brute_at=(2, 15, 41))  # a key's start, the nested object's, `xyz`
    assert refined._trans.shape[1] > narrow, "the keys refined the columns"
    for i, mask in enumerate(masks_along(whole, vocab, text)):
        assert np.array_equal(masks[i], mask), (text[:i], np.flatnonzero(masks[i] != mask)[:5])
    table = refined._byte_class
    pieces = [*refined._keys_parts.values(), *refined._hub_parts.values(), *(p for ps in refined._values for p in ps)]
    for part in pieces:
        assert part.byte_class is not None
        assert np.array_equal(part.byte_class, part.byte_class[refined._columns][table])


def test_a_table_whose_buffers_double_gives_the_masks_of_one_that_never_does(vocab, monkeypatch):
    """The index reads the table's reserved buffers and moves with them when they double; a build also builds
    the waiting states a byte past the ones a walk reached. Along a decode through nested lazy objects, a table
    reserved 16 rows (doubling many times) building ahead gives at every byte the masks of a table reserved in
    full building nothing ahead, and both equal brute force (every token's bytes fed at the state) at a few."""
    import radixlang.runtime.constrained.object_dispatch as object_dispatch
    from radixlang.runtime.constrained.compiler import ConstraintCompiler

    text = '{"p5":1,"kid":{"q3":4,"q1":2},"p0":7,"x":"hi","kids":[{"q1":0,"q9":5}],"p2":3}'
    assert jsonschema.Draft202012Validator(OUTER).is_valid(json.loads(text))

    monkeypatch.setattr(object_dispatch, "_RESERVED_ROWS", 16)
    small = ConstraintCompiler(lambda: vocab).compile("json_schema", OUTER)
    assert isinstance(small, ObjectDispatch)
    grown = masks_along(small, vocab, text, brute_at=(1, 15, 35, 59))  # a key's start, the nested object's, after it, in `kids`
    assert len(small._trans) > 16 and small.index.dfa.trans is small._trans, "the buffers doubled, the index moved"
    monkeypatch.setattr(object_dispatch, "_RESERVED_ROWS", 4 * object_dispatch.MAX_GROWN_STATES)
    monkeypatch.setattr(object_dispatch, "BUILD_AHEAD_BYTES", 0)
    full = ConstraintCompiler(lambda: vocab).compile("json_schema", OUTER)
    for i, mask in enumerate(masks_along(full, vocab, text)):
        assert np.array_equal(grown[i], mask), (text[:i], np.flatnonzero(grown[i] != mask)[:5])


def test_runs_and_layers_match_their_definitions(monkeypatch):
    """A stretch is laid from the value's breadth-first distances (_Layers), its rows shifted into the table
    (_shifted_at; without the C library, run by run: _runs), in C and in numpy: each against plain definitions, on
    random tables (states not reached included)."""
    from radixlang.runtime.constrained import object_dispatch
    from radixlang.runtime.constrained.object_dispatch import _Layers, _runs, _shifted_at

    rng = np.random.default_rng(0)
    assert _runs(np.zeros(0, np.int64)) == []
    for _ in range(100):
        states = np.unique(rng.choice(200, int(rng.integers(1, 60)), replace=True))
        runs = _runs(states)
        assert [q for first, end in runs for q in range(first, end)] == states.tolist()
        assert all(b < c for (_, b), (c, _) in zip(runs, runs[1:]))  # runs are apart
        size, width = int(rng.integers(1, 400)), int(rng.integers(1, 8))
        table = np.where(rng.random((size, width)) < 0.3, rng.integers(0, size, (size, width)), -1)
        seen, level, want = {0}, [0], [[0]]
        while level:
            level = sorted({int(t) for q in level for t in table[q] if t >= 0 and t not in seen})
            seen.update(level)
            want.append(level)
        want.pop()  # the search's last level is empty
        for native in (True, False):
            if not native:
                monkeypatch.setattr(object_dispatch.native_fsa, "library", lambda: None)
            layers = _Layers(table, 0)
            assert layers.farthest == len(want) - 1
            assert [layers.within(d, d).tolist() for d in range(len(want) + 2)] == want + [[], []]
            assert layers.within(1, len(want)).tolist() == sorted(q for lv in want[1:] for q in lv)
            assert sorted(np.flatnonzero(layers.dist >= 0).tolist()) == sorted(seen)
            rows = np.where(rng.random((size, 256)) < 0.5, rng.integers(0, size, (size, 256)), -1).astype(np.int32)
            which = np.unique(rng.choice(size, int(rng.integers(1, size + 1)), replace=True))
            columns = np.unique(rng.choice(256, width, replace=False)).astype(np.int64)
            out = np.full((size, len(columns)), -7, np.int32)
            _shifted_at(rows, which, out, 1000, columns)
            want_rows = np.full((size, len(columns)), -7, np.int32)
            picked = rows[which][:, columns]
            want_rows[which] = np.where(picked >= 0, picked + 1000, picked)
            assert np.array_equal(out, want_rows)
            monkeypatch.undo()


def random_json(rng: random.Random, depth: int) -> str:
    """Any JSON value nesting up to `depth` containers deep."""
    if depth == 0 or rng.random() < 0.25:
        return rng.choice(['1', '"s"', 'true', 'null', '-2.5', '""'])
    items = [random_json(rng, depth - 1) for _ in range(rng.randint(0, 2))]
    if rng.random() < 0.5:
        return "[" + ",".join(items) + "]"
    return "{" + ",".join(f'"k{i}":{v}' for i, v in enumerate(items)) + "}"


def test_undeclared_values_in_a_lazily_built_table_nest_any_depth(compiler):
    """An undeclared member's value (and a free-form object's) is inline two levels deep; deeper containers are a
    marker the table lays a level at a time as the decode reaches it. Before, such values nested two levels at
    most and deeper ones were refused (JSONSchemaBench's Kubernetes objects under a `{"type": "object"}`).
    Random values up to 6 deep, some made malformed (a bracket dropped, a comma before one), accepted exactly
    when jsonschema says valid; the masks at each byte of a deep value equal each token's bytes fed one at a
    time, where a level is laid and where it closes."""
    schema = {"type": "object", "properties": {**{f"p{i}": DIGIT for i in range(N - 2)}, "data": {"type": "object"}},
              "required": ["p0"]}
    constraint = compiler.compile("json_schema", schema)
    assert isinstance(constraint, ObjectDispatch) and constraint.unenforced == ()
    validator = jsonschema.Draft202012Validator(schema)
    rng, seen = random.Random(5), {True: 0, False: 0, "deep": 0}
    for _ in range(120):
        values = {"data": "{" + f'"a":{random_json(rng, 5)}' + "}", "x": random_json(rng, 6), "p3": "4"}
        members = ['"p0":1'] + [f'"{k}":{values[k]}' for k in rng.sample(sorted(values), 2)]
        rng.shuffle(members)
        text = "{" + ",".join(members) + "}"
        if rng.random() < 0.2:
            at = rng.choice([i for i, ch in enumerate(text) if ch in "]}"][:-1] or [len(text) - 1])
            text = text[:at] + ("," if rng.random() < 0.5 else "") + text[at + 1:]
        try:
            valid = validator.is_valid(json.loads(text)) and unique_keys(text)
        except ValueError:
            valid = False
        seen[valid] += 1
        seen["deep"] += valid and max(itertools.accumulate(1 if ch in "[{" else -1 if ch in "]}" else 0
                                                           for ch in text)) > 4
        assert accepts(constraint, text) == valid, text
    assert seen[True] > 40 and seen[False] > 15 and seen["deep"] > 10, seen
    deep = '{"x":{"a":[{"b":{"c":[1,{"d":"e"}]}}]},"p0":1}'
    masks_along(constraint, constraint.vocab, deep, brute_at=(9, 14, 19, 24, 29, 33, 37, 38, 39, 40))


def test_undeclared_values_where_another_value_reads_a_brace_nest_a_bounded_depth(compiler):
    """A large object's member that is an anyOf of two small objects, where `b` is an undeclared value in one and
    three closed objects deep in the other: after `{"b":{"y":{"w":` one reads the marker (the third level) and the
    other a brace, so the table cannot lay the marker there; the schema compiles again with undeclared values two
    levels deep at most (as before), still a lazily built table; its language against jsonschema within that
    depth."""
    def closed(properties: dict) -> dict:
        return {"type": "object", "properties": properties, "additionalProperties": False}

    member = {"anyOf": [{"type": "object", "properties": {"a": DIGIT}},
                        closed({"a": DIGIT, "b": closed({"y": closed({"w": closed({"z": DIGIT})})})})]}
    schema = {"type": "object", "properties": {**{f"p{i}": DIGIT for i in range(N - 2)}, "k": member},
              "required": ["k"], "additionalProperties": False}
    constraint = compiler.compile("json_schema", schema)
    assert isinstance(constraint, ObjectDispatch) and constraint.unenforced == ()
    validator = jsonschema.Draft202012Validator(schema)
    for text in ('{"k":{"b":{"y":{"w":{"z":1}}}}}', '{"k":{"b":{"y":{"w":1}}}}', '{"k":{"b":[1]}}',
                 '{"k":{"b":{"q":[1]}},"p1":2}', '{"k":{"a":"s"}}', '{"k":{"a":2,"c":[1]}}', '{"k":{"b":{"z":"s"}}}',
                 '{"p1":1}'):
        assert accepts(constraint, text) == validator.is_valid(json.loads(text)), text
