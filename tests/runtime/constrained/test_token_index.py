"""The token index (the native walk, and the numpy one) against a byte-by-byte brute force."""
from __future__ import annotations

import copy
import os
import random
import shutil

import numpy as np
import pytest

from radixlang.runtime.constrained.masks.token_index import TokenIndex
from radixlang.runtime.constrained.masks.vocab import TokenVocab
from radixlang.runtime.constrained.regex.automaton import compile_dfa
from radixlang.runtime.constrained.regex.regex_parser import parse_regex


def brute_force_allowed(dfa, vocab: TokenVocab, state: int) -> np.ndarray:
    out = np.zeros(vocab.size, bool)
    for row, tid in enumerate(vocab.ids.tolist()):
        out[tid] = dfa.walk(state, vocab.token_bytes[tid]) >= 0
    return out


def numpy_only(vocab: TokenVocab) -> TokenVocab:
    """`vocab` with the native walk turned off (where no C compiler is found, every vocabulary is so)."""
    out = copy.copy(vocab)
    out.native_trie = None  # the cached property, set: TokenIndex then walks with numpy
    return out


WALKS = ["native", "numpy"]


def small_vocab(seed: int, walk: str = "native") -> TokenVocab:
    rng = random.Random(seed)
    alphabet = b'ab"{}:,0123456789 \\' + "é😀".encode()
    tokens = [bytes([b]) for b in range(256)]
    tokens += [bytes(rng.choice(alphabet) for _ in range(rng.randint(2, 7))) for _ in range(300)]
    tokens += [b"", b"<special>"]
    vocab = TokenVocab.create(tokens, special_ids={len(tokens) - 1}, end_ids=[len(tokens) - 1], size=len(tokens) + 3)
    return vocab if walk == "native" else numpy_only(vocab)


def test_the_native_walk_is_built_where_a_c_compiler_is():
    if not (shutil.which("cc") or shutil.which("gcc")) or os.environ.get("RADIXLANG_NATIVE_MASKS") == "0":
        pytest.skip("no C compiler (or turned off): masks take the numpy walk")
    assert small_vocab(0).native_trie is not None


# dense states: a loop on most bytes (skipped by the native walk), and a bounded string (no loop)
@pytest.mark.parametrize("pattern", [r'\{"a":[0-9]{1,3}(,"b":"[^"]*")?\}', r"(ab|é)*😀?", r"[0-9 ,]+",
                                     r'"([^"\\]|\\.)*"(,"[^"]{0,12}")?', r'"[^"]{0,40}"'])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("walk", WALKS)
def test_index_matches_brute_force_on_a_small_vocab(pattern, seed, walk):
    vocab = small_vocab(seed, walk)
    dfa = compile_dfa([parse_regex(pattern)])
    index = TokenIndex(dfa, vocab)
    for state in range(dfa.num_states):
        assert np.array_equal(index.mask(state), brute_force_allowed(dfa, vocab, state)), (pattern, state)


def test_index_never_allows_special_or_empty_tokens():
    vocab = small_vocab(0)
    dfa = compile_dfa([parse_regex(r"(?s:.)*")])
    mask = TokenIndex(dfa, vocab).mask(dfa.start)
    n = len(vocab.token_bytes)
    assert not mask[n - 1] and not mask[n - 2] and not mask[n:].any()


@pytest.mark.parametrize("walk", WALKS)
def test_index_matches_brute_force_on_the_real_vocab(vocab, walk):
    dfa = compile_dfa([parse_regex(r'\{"name":"[a-zA-Z ]{1,12}","n":-?[0-9]{1,4}\}')])
    index = TokenIndex(dfa, vocab if walk == "native" else numpy_only(vocab))
    for state in random.Random(0).sample(range(dfa.num_states), 6) + [dfa.start]:
        assert np.array_equal(index.mask(state), brute_force_allowed(dfa, vocab, state))


@pytest.mark.parametrize("walk", WALKS)
def test_boundaries_record_tokens_that_end_a_complete_lexeme_part_way(walk):
    vocab = small_vocab(0, walk)
    dfa = compile_dfa([parse_regex('"[^"]*"'), parse_regex("[0-9]+")], nonempty=True)
    index = TokenIndex(dfa, vocab, boundaries=True)
    for state in range(dfa.num_states):
        rows, pos, labels = index.boundaries(state)
        expected = set()
        for row, tid in enumerate(vocab.ids.tolist()):
            data, s = vocab.token_bytes[tid], state
            for i, b in enumerate(data):
                nxt = dfa.step(s, b)
                if nxt < 0:
                    if i > 0 and dfa.accept[s] >= 0:
                        expected.add((row, i, int(dfa.accept[s])))
                    break
                s = nxt
        assert set(zip(rows.tolist(), pos.tolist(), labels.tolist())) == expected


def test_forced_bytes_follow_single_exits():
    vocab = small_vocab(0)
    dfa = compile_dfa([parse_regex(r'\{"key":(1|22)\}')])
    index = TokenIndex(dfa, vocab)
    state, forced = dfa.start, bytearray()
    while index.forced_byte(state) >= 0:
        forced.append(index.forced_byte(state))
        state = dfa.step(state, forced[-1])
    assert bytes(forced) == b'{"key":'


def test_vocab_trie_nodes_are_exactly_the_tokens_prefixes():
    vocab = small_vocab(1)
    trie = vocab.trie
    rows_bytes = [vocab.token_bytes[t] for t in vocab.ids.tolist()]
    prefixes: list[list[bytes]] = []  # per level, each node's prefix, rebuilt from parents and bytes
    for depth, level in enumerate(trie.levels, 1):
        above = prefixes[-1] if prefixes else [b""] * trie.root_children
        prefixes.append([above[p] + bytes([b]) if depth > 1 else bytes([b])
                         for p, b in zip(level.parent.tolist(), level.byte.tolist())])
        expected = {r[:depth] for r in rows_bytes if len(r) >= depth}
        assert sorted(prefixes[-1]) == sorted(expected) and len(set(prefixes[-1])) == len(expected)
        for k, prefix in enumerate(prefixes[-1]):  # a node's row range holds exactly its prefix's tokens
            rows = trie.sorted_rows[level.row_start[k]:level.row_end[k]].tolist()
            assert sorted(rows) == [r for r, b in enumerate(rows_bytes) if b.startswith(prefix)]
            children = range(level.child_start[k], level.child_start[k + 1])
            if depth < len(trie.levels):
                assert all(trie.levels[depth].parent[c] == k for c in children)
    flat = [p for level in prefixes for p in level]
    assert [flat[n] for n in trie.token_node.tolist()] == rows_bytes


def test_native_row_walks_match_a_byte_by_byte_walk():
    vocab = small_vocab(1)
    if vocab.native_trie is None:
        pytest.skip("no C compiler: the numpy walk is the only one")
    dfa = compile_dfa([parse_regex('"[^"]*"'), parse_regex("[0-9]+")], nonempty=True)
    rows = np.arange(len(vocab.ids))
    for start, offset in [(dfa.start, 0), (dfa.start, 1), (dfa.step(dfa.start, ord('"')), 0)]:
        walk = TokenIndex(dfa, vocab).walk_rows(rows, start, offset)
        for r in rows.tolist():
            data, s = vocab.token_bytes[int(vocab.ids[r])][offset:], start
            for i, b in enumerate(data):
                nxt = dfa.step(s, b)
                if nxt < 0:
                    assert (walk.end_state[r], walk.stop_pos[r], walk.stop_state[r]) == (-1, offset + i, s)
                    break
                s = nxt
            else:
                assert walk.end_state[r] == s


def test_a_bounded_strings_run_is_skipped_and_its_masks_match_brute_force_on_the_real_vocab(vocab):
    """States inside a bounded string do not loop; their run (the bytes that all lead on, and for how many
    bytes in a row) presets the tokens of those bytes no longer than it, from a per-vocabulary cache: the
    masks, near the bound (tokens longer than what is left) and far from it, equal a byte-by-byte walk. The
    run's end (the bound) reads none of its bytes, a dead tail: the longer tokens of its bytes are settled as
    not read, so even the last characters, whose runs are short, skip theirs."""
    if vocab.native_trie is None:
        pytest.skip("no C compiler: the numpy walk is the only one")
    dfa = compile_dfa([parse_regex(r'"([^"\\]|\\["\\n]){0,20}",[0-9]')])
    index = TokenIndex(dfa, vocab)
    walker = index._walker(vocab.native_trie)
    state, runs = dfa.step(dfa.start, ord('"')), []
    for k in range(20):  # 20 characters into the string: a run of 20 down to 1
        loop, length, dead_tail = walker._skip_set(state, False)
        runs.append(length if loop is not None else 0)
        assert dead_tail, k
        if k in (0, 5, 12, 13, 15, 19):
            assert np.array_equal(index.mask(state), brute_force_allowed(dfa, vocab, state)), k
        state = dfa.step(state, ord("a"))
    assert runs == list(range(20, 0, -1)), runs  # skipped however short the run


def test_a_short_run_whose_tail_reads_on_is_walked_and_an_accepting_tail_keeps_its_boundaries(vocab):
    """A dead tail needs the run's end to read none of its bytes: three letters, then letters or digits, read
    on past the run (its tail is alive: the short run is walked, not skipped). A lexer's bounded word accepts at
    its end: a token dying there is a boundary, so a walk recording boundaries does not settle those tokens, and
    its boundaries equal the numpy walk's; without boundaries the tail is dead. Masks equal brute force."""
    if vocab.native_trie is None:
        pytest.skip("no C compiler: the numpy walk is the only one")
    dfa = compile_dfa([parse_regex(r"[a-zA-Z]{3}[a-zA-Z0-9]*,")])
    index = TokenIndex(dfa, vocab)
    assert index._walker(vocab.native_trie)._skip_set(dfa.start, False)[0] is None
    assert np.array_equal(index.mask(dfa.start), brute_force_allowed(dfa, vocab, dfa.start))
    word = compile_dfa([parse_regex(r"[a-zA-Z]{0,6}")])
    for boundaries in (False, True):
        index = TokenIndex(word, vocab, boundaries=boundaries)
        loop, length, dead_tail = index._walker(vocab.native_trie)._skip_set(word.start, boundaries)
        # recording boundaries, the run (6 < RUN_MIN_LENGTH) with an accepting tail is walked
        assert (loop is None) if boundaries else (loop is not None and length == 6 and dead_tail)
        state = word.start
        for k in range(6):
            bits, bounds = index._walk(state)
            want_bits, want_bounds = index._walk_numpy(state)
            assert np.array_equal(bits, want_bits), (boundaries, k)
            got = sorted(zip(*(a.tolist() for a in bounds)))
            assert got == sorted(zip(*(a.tolist() for a in want_bounds))), (boundaries, k)
            assert not boundaries or got, "tokens die after a complete word"
            state = word.step(state, ord("q"))
    assert np.array_equal(index.mask(word.start), brute_force_allowed(word, vocab, word.start))


def test_a_run_presets_only_tokens_no_longer_than_it_and_walks_the_longer_ones(vocab):
    """Nine letters, then letters or digits: the start state's run is the letters, 9 long; tokens of ten
    letters or more read on (into the loop) although the run has ended, so the walk must descend to them."""
    if vocab.native_trie is None:
        pytest.skip("no C compiler: the numpy walk is the only one")
    dfa = compile_dfa([parse_regex(r"[a-zA-Z]{9}[a-zA-Z0-9]*,")])
    index = TokenIndex(dfa, vocab)
    loop, length, _ = index._walker(vocab.native_trie)._skip_set(dfa.start, False)
    assert loop is not None and length == 9
    brute = brute_force_allowed(dfa, vocab, dfa.start)
    assert any(len(vocab.token_bytes[t]) >= 10 for t in np.flatnonzero(brute).tolist()), "the case is tested"
    assert np.array_equal(index.mask(dfa.start), brute)


def test_region_masks_kept_per_vocabulary_equal_the_plain_walk_over_varied_states(compiler, vocab, walk):
    """A dense state's tokens inside its region (a string's body with its UTF-8 and escapes) come from a walk
    kept per region shape and vocabulary, and the walk skips the subtrees without an exit byte. Over random
    walks of schemas with free keys (a key's first byte leads apart from the declared keys' letters: the region
    one byte in), string values, a lazily built table and a grammar's lexers (which record boundaries), every
    state's mask equals the walk without regions; an array's strings reuse the object's string shape; a dense
    state's mask is checked token by token."""
    from radixlang.runtime.constrained.masks.native_trie import NativeWalker

    if vocab.native_trie is None:
        pytest.skip("no C compiler: masks take the numpy walk")
    text = {"type": "string"}
    schemas = [{"type": "object", "properties": {"name": text, "note": {"type": "string", "pattern": "^[a-zé]*$"}},
                "additionalProperties": {"type": "integer"}},
               {"type": "array", "items": text},
               {"type": "object", "properties": {f"k{i}": text for i in range(12)}},
               {"type": "object", "properties": {"kid": {"$ref": "#"}, "s": text}}]
    regions = vocab.native_trie._regions
    kinds, new_shapes, region_states = set(), [], []
    for i, schema in enumerate(schemas):
        constraint = compiler.compile("json_schema", schema)
        kinds.add(type(constraint).__name__)
        before, count = set(regions), 0
        rng = random.Random(i)
        for _ in range(8):
            walk(constraint, rng, max_tokens=40)
        indexes = ([lex.index for lex in constraint._lexers.values()] if hasattr(constraint, "_lexers")
                   else [constraint.index])
        for index in indexes:
            plain = NativeWalker(vocab.native_trie, index.dfa, index.unbuilt, regions=False, dense=False)
            walker = index._walker(vocab.native_trie)
            for state, (bits, _) in list(index._states.items()):
                if index.unbuilt is not None and index.unbuilt[state]:
                    continue
                assert np.array_equal(bits, plain.walk(state, index.with_boundaries).bits), (i, state)
                count += walker._region(state, index.with_boundaries) is not None
        new_shapes.append(set(regions) - before)
        region_states.append(count)
    assert kinds == {"RegexConstraint", "ObjectDispatch", "GrammarConstraint"}
    assert all(region_states), region_states
    assert region_states[1] and not new_shapes[1], "an array's strings reuse the shape kept for the object's"
    dfa = compile_dfa([parse_regex(r'"([^"\\]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')])
    inside = dfa.walk(dfa.start, b'"')
    assert np.array_equal(TokenIndex(dfa, vocab).mask(inside), brute_force_allowed(dfa, vocab, inside))


def test_dense_states_walk_their_unsettled_tokens_alone_and_equal_the_trie_walk(compiler, vocab, walk):
    """A dense state (a string's body: a loop on most bytes; a bounded string: a run) settles every token made of
    its skip set's bytes at once and walks each other token alone (native_trie's dense_split, token_walk.c's
    rl_walk_candidates), where the trie walk visits every child on their paths. Over random walks of a regex, a
    lazily built table (whose walks stop at unbuilt rows) and a grammar's lexers (which record boundaries), each
    kept state's bits, boundary records (rows, positions, labels, in the same order) and unbuilt states reached
    equal the plain trie walk's, with no skipping at all; the dense path was taken in each; a dense state's
    mask equals a byte-by-byte walk of every token."""
    from radixlang.runtime.constrained.masks.native_trie import NativeWalker

    if vocab.native_trie is None:
        pytest.skip("no C compiler: masks take the numpy walk")
    text, short = {"type": "string"}, {"type": "string", "maxLength": 30}
    schemas = [{"type": "object", "properties": {"a": text, "b": short}, "required": ["a"],
                "additionalProperties": False},
               {"type": "object", "properties": {f"k{i}": {"type": "string", "maxLength": 500} for i in range(10)}},
               {"type": "object", "properties": {"kid": {"$ref": "#"}, "s": text, "t": short}}]
    seen_kinds, dense_states = [], []
    for i, schema in enumerate(schemas):
        constraint = compiler.compile("json_schema", schema)
        seen_kinds.append(type(constraint).__name__)
        rng = random.Random(i)
        for _ in range(6):
            walk(constraint, rng, max_tokens=40)
        indexes = ([lex.index for lex in constraint._lexers.values()] if hasattr(constraint, "_lexers")
                   else [constraint.index])
        dense = 0
        for index in indexes:
            plain = NativeWalker(vocab.native_trie, index.dfa, index.unbuilt, regions=False, dense=False)
            walker = index._walker(vocab.native_trie)
            for state in list(index._states):
                if index.unbuilt is not None and index.unbuilt[state]:
                    continue
                ours, theirs = walker.walk(state, index.with_boundaries), plain.walk(state, index.with_boundaries)
                for field in ("bits", "bound_rows", "bound_pos", "bound_labels", "unbuilt"):
                    assert np.array_equal(getattr(ours, field), getattr(theirs, field)), (i, state, field)
                loop, length, dead_tail = walker._skip_set(state, index.with_boundaries)
                if loop is not None and vocab.native_trie.dense_split(loop, length, dead_tail) is not None:
                    dense += 1
                    if dense == 1:  # one state per schema, token by token
                        dfa = index.dfa
                        brute = np.zeros(vocab.size, bool)
                        for tid in vocab.ids.tolist():
                            brute[tid] = dfa.walk(state, vocab.token_bytes[tid]) >= 0
                        assert np.array_equal(np.unpackbits(ours.bits, count=vocab.size, bitorder="little")
                                              .view(bool), brute), (i, state)
        dense_states.append(dense)
    assert seen_kinds == ["RegexConstraint", "ObjectDispatch", "GrammarConstraint"], seen_kinds
    assert all(dense_states), dense_states
    # a lexer's accepting dense state: a token dying after a byte or more is a boundary, one dying at once is not
    lexeme = compile_dfa([parse_regex(r'[^"\n]*')])
    index = TokenIndex(lexeme, vocab, boundaries=True)
    walker = index._walker(vocab.native_trie)
    ours = walker.walk(lexeme.start, True)
    theirs = NativeWalker(vocab.native_trie, lexeme, None, regions=False, dense=False).walk(lexeme.start, True)
    assert len(ours.bound_rows) and (ours.bound_pos >= 1).all()
    for field in ("bits", "bound_rows", "bound_pos", "bound_labels"):
        assert np.array_equal(getattr(ours, field), getattr(theirs, field)), field
    # a lazily built table just past a key: the value's rest is unbuilt, and both walks stop at the same rows
    table = compiler.compile("json_schema", {"type": "object", "properties": {
        f"p{i}": {"type": "string", "maxLength": 400} for i in range(9)}})
    state = table.advance_bytes(table.initial(), b'{"p3":"ab')
    table._packed(state)  # built as far as its walk reads
    stopped = 0
    for k in range(1, 200):  # later states, before a walk lays their rows
        nxt = table.advance_bytes(state, b"a" * k)
        if nxt is None or table.unbuilt[nxt]:
            break
        walker = table.index._walker(vocab.native_trie)
        ours = walker.walk(nxt, False)
        theirs = NativeWalker(vocab.native_trie, table.index.dfa, table.index.unbuilt, regions=False,
                              dense=False).walk(nxt, False)
        assert np.array_equal(ours.unbuilt, theirs.unbuilt), k
        if len(ours.unbuilt):
            stopped += 1
        else:
            assert np.array_equal(ours.bits, theirs.bits), k
    assert stopped, "some walk stopped at unbuilt rows"


def test_walks_shared_by_signature_equal_the_unshared_walk_across_dfas(monkeypatch):
    """States of different DFAs that read alike (other state numbers, other byte classes) share one walk, kept
    per vocabulary under a signature of what the walk reads (native_trie's `signature`). Over lexers (recording
    boundaries) whose string and number states read alike, two with their labels swapped (a walk recording
    boundaries must not take the other's labels), and regexes, every state's bits and boundaries equal the walk
    without sharing, and many states are served by another DFA's walk."""
    from radixlang.runtime.constrained.masks import token_index

    vocab = small_vocab(2)
    native = vocab.native_trie
    if native is None:
        pytest.skip("no C compiler: masks take the numpy walk")
    string, number = r'"([^"\\]|\\["\\n])*"', "-?[0-9]+"
    cases = [([string, number], True), ([number, string], True), ([string, number, "true|false|null"], True),
             (["[a-z]+", string], True), ([r'\{"a":' + string + "," + number + r"\}"], False),
             ([r"\[(" + number + ",)*" + string + r"\]"], False), ([string + "|" + number], False)]
    served = walked = 0
    for patterns, boundaries in cases:
        dfa = compile_dfa([parse_regex(p) for p in patterns], nonempty=boundaries)
        shared = TokenIndex(dfa, vocab, boundaries)
        walker = shared._walker(native)
        for state in range(dfa.num_states):
            signature = walker.signature(state, boundaries)
            served += signature is not None and native.shared_walk(signature) is not None
            walked += 1
            bits, bounds = shared._entry(state)
            monkeypatch.setattr(token_index, "SHARE_WALKS", False)
            plain_bits, plain_bounds = TokenIndex(dfa, vocab, boundaries)._entry(state)
            monkeypatch.setattr(token_index, "SHARE_WALKS", True)
            assert np.array_equal(bits, plain_bits), (patterns, state)
            assert all(np.array_equal(a, b) for a, b in zip(bounds, plain_bounds)), (patterns, state)
    assert served >= walked // 6, (served, walked)
    # a string's body in the first two lexers: alike as masks, apart where the accepted labels are read
    inside = [TokenIndex(compile_dfa([parse_regex(p) for p in pats], nonempty=True), vocab, True)
              for pats, _ in cases[:2]]
    sigs = [(ix._walker(native).signature(ix.dfa.step(ix.dfa.start, ord('"')), False),
             ix._walker(native).signature(ix.dfa.step(ix.dfa.start, ord('"')), True)) for ix in inside]
    assert sigs[0][0] == sigs[1][0] and sigs[0][1] != sigs[1][1]
