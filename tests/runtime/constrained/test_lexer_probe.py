"""Lexer probes (suffix walks through lexers no decode has built) against the built lexers' native walks."""
from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np

from radixlang.runtime.constrained.grammar.constraint import GrammarConstraint, _walked
from radixlang.runtime.constrained.grammar.lexer_probe import LexerProbe, LiteralPiece, ProbePiece

# named keys beside free ones, a non-ASCII key and a Unicode-class pattern (multi-byte characters, UTF-8 cut
# inside a token), recursion (a grammar, so objects are checked members: a lexer per set of keys left); a pattern
# within length bounds and a multipleOf are terminals given as compiled DFAs, and a long maxLength a repeat that
# probes embed as its own DFA (probes walk both in place)
SCHEMA = {"type": "object", "properties": {
    "name": {"type": "string", "maxLength": 8},
    "note": {"type": "string", "maxLength": 300},
    "code": {"type": "string", "pattern": "^[a-z]+[0-9]*$", "maxLength": 5},
    "m": {"type": "integer", "multipleOf": 7},
    "é": {"type": "string", "pattern": "^[α-ω]{1,4}$"},
    "kids": {"type": "array", "items": {"$ref": "#"}}},
    "additionalProperties": {"type": "integer"}}
TEXTS = ['{"kids":[{"kids":[{"name":"ab","é":"αβ","kids":[{"x":1}]},{"y":-2}]}],"name":"z"}',
         '{"é":"ω","name":"q","kids":[{},{"kids":[{"kids":[{"n":30,"é":"γ","code":"ab1"}]}],"name":""}]}',
         '{"m":-14,"code":"xyz","kids":[{"m":0,"name":"a","note":"a\\"é\\u00e9"}]}']
CALC = r"""
start: stmt+
stmt: "let" NAME "=" expr ";" | "print" expr ";"
?expr: term (("+" | "-") term)*
?term: INT | NAME | "set" | "(" expr ")"
NAME: /[a-zé_][a-z0-9_]*/
%import common.INT
%import common.WS_INLINE
%ignore WS_INLINE
"""


def _walked_states(constraint, texts: list[str]) -> list:
    states = []
    for text in texts:
        state = constraint.initial()
        for b in text.encode():
            state = constraint.advance_bytes(state, bytes([b]))
            assert state is not None, text
            states.append(state)
    return list(dict.fromkeys(states))


def test_a_probe_walks_rows_as_the_built_lexer_does(compiler, vocab):
    """For every lexer a JSON schema's grammar (terminals read every way they match) and a Lark grammar (the
    preferred terminal where two match: `set` as a keyword, not a name; ignored whitespace) build along texts,
    its probe (NFA walked lazily) gives the built DFA's native walk's answers exactly: rows alive at their end,
    and rows ending a lexeme part-way by the terminals it reads as and where; over random rows from random
    offsets, and rows holding multi-byte characters (cut at the token's end, or in a class not read)."""
    rng = np.random.default_rng(0)
    wide = np.flatnonzero((vocab.matrix >= 0x80).any(axis=1))
    # "set" is two terminals, and `setText` ends it part-way
    kw = np.flatnonzero((vocab.matrix[:, :3] == np.frombuffer(b"set", np.uint8)).all(axis=1) & (vocab.lengths > 3))
    # a quote inside: a string's body (a compiled DFA) ends there and the lexeme goes on
    closing = np.flatnonzero((vocab.matrix[:, 1:] == ord('"')).any(axis=1))
    rows = np.unique(np.concatenate([rng.choice(len(vocab.lengths), 3000, replace=False), kw, closing,
                                     rng.choice(wide, min(3000, len(wide)), replace=False)]))
    offsets = (rng.random(len(rows)) * vocab.lengths[rows]).astype(np.int64)
    checked = embedded = long_repeats = wide_literals = 0
    for kind, spec, texts in [("json_schema", SCHEMA, TEXTS), ("grammar", CALC, ["let é = (x1+ 2);print  é+set;"])]:
        constraint = compiler.compile(kind, spec)
        assert isinstance(constraint, GrammarConstraint)
        _walked_states(constraint, texts)
        for names, lex in list(constraint._lexers.items()):
            probe = LexerProbe(*constraint._lexer_nodes(names)[::-1], constraint.grammar.readings)
            parts = [part for piece in probe._pieces if isinstance(piece, ProbePiece) for part in piece._moves.parts]
            embedded += len(parts)
            wide_literals += any(isinstance(piece, LiteralPiece) and max(piece._codes) >= 0x80
                                 for piece in probe._pieces)  # the key "é" (a keyword: "let", "set")
            long_repeats += any(len(part.trans) > 300 for part in parts)  # note's 300 characters
            for p in (0, offsets):
                ok, nested = probe.suffixes(vocab, rows, p)
                want_ok, want_nested = _walked(lex, rows, p)
                assert np.array_equal(np.sort(ok), np.sort(want_ok)), (sorted(names), p)
                assert [n for n, _, _ in nested] == [n for n, _, _ in want_nested], sorted(names)
                for (_, got_rows, got_pos), (_, want_rows, want_pos) in zip(nested, want_nested):
                    order, want = np.argsort(got_rows), np.argsort(want_rows)
                    assert np.array_equal(got_rows[order], want_rows[want]), sorted(names)
                    assert np.array_equal(got_pos[order], want_pos[want]), sorted(names)
                checked += len(nested) + bool(len(ok))
    assert checked > 20, "the rows should exercise lexemes ending part-way"
    assert embedded, "some lexer should read a terminal given as a compiled DFA"
    assert long_repeats, "some probe should embed note's long repeat"
    assert wide_literals, "some probe should read a fixed string holding a multi-byte character"


def test_a_grammars_probes_share_each_terminals_piece(compiler, vocab):
    """A probe is a piece per terminal, kept by the grammar across its probes: a probe of the keys left after one
    more member builds no piece anew, and, its pieces stepped before by the larger probe, walks rows as a probe
    built on its own does."""
    constraint = compiler.compile("json_schema", SCHEMA)
    _walked_states(constraint, TEXTS)
    names = max(constraint._lexers, key=len)
    order, nodes = constraint._lexer_nodes(names)
    assert len(nodes) > 3, sorted(names)
    rng = np.random.default_rng(1)
    rows = np.unique(np.concatenate([rng.choice(len(vocab.lengths), 2000, replace=False),
                                     np.flatnonzero((vocab.matrix[:, 1:] == ord('"')).any(axis=1))]))
    pieces: dict = {}
    larger = LexerProbe(nodes, order, constraint.grammar.readings, pieces)
    larger.suffixes(vocab, rows, 0)
    built = len(pieces)
    smaller = LexerProbe(nodes[1:], order[1:], constraint.grammar.readings, pieces)
    assert len(pieces) == built and all(a is b for a, b in zip(smaller._pieces, larger._pieces[1:]))
    alone = LexerProbe(nodes[1:], order[1:], constraint.grammar.readings)
    for p in (0, 1):
        (ok, nested), (want_ok, want_nested) = smaller.suffixes(vocab, rows, p), alone.suffixes(vocab, rows, p)
        assert np.array_equal(ok, want_ok) and len(nested) == len(want_nested)
        for (got_names, got_rows, got_pos), (want_names, want_rows, want_pos) in zip(nested, want_nested):
            assert got_names == want_names
            assert np.array_equal(got_rows, want_rows) and np.array_equal(got_pos, want_pos)


class _Built(GrammarConstraint):
    """Every suffix walk through a built lexer (no probes), each walked for itself (none shared by what it reads)."""

    def _probe(self, names):
        lex = self._lexers.get(names) or self._lexers.setdefault(names, self._build_lexer(names))
        return SimpleNamespace(suffixes=lambda vocab, rows, p: _walked(lex, rows, p))

    @staticmethod
    def _walk_key(names, rows, p):
        return object()


def test_masks_with_probed_lexers_equal_masks_with_built_ones(compiler, vocab, walk):
    """Along texts and random walks of a recursive schema (where the comma after an object's last member,
    and the keys left after it, are lexers no decode reaches), the masks computed through probes, with suffix
    walks shared by what they read, equal those of the same grammar whose suffix walks build every lexer and
    are each walked for itself; probes are met and walks are shared (the check exercises both), and the
    deepest state's mask equals advancing each token."""
    probed = GrammarConstraint(compiler.compile("json_schema", SCHEMA).grammar, vocab)
    built = _Built(probed.grammar, vocab)
    states = _walked_states(probed, TEXTS)
    rng = random.Random(0)
    for _ in range(4):
        state = probed.initial()
        for _ in range(40):
            allowed = np.flatnonzero(probed.allowed(state))
            if not len(allowed):
                break
            state = probed.advance(state, int(allowed[rng.randrange(len(allowed))]))
            states.append(state)
    for state in states:
        assert np.array_equal(probed.allowed_bits(state), built.allowed_bits(state)), state
    assert probed._probes, "some suffix walk should read a lexer no decode built"
    assert len(probed._walks) < len(probed._suffixes), "some suffix walks should share one walk"
    deepest = states[-1]
    brute = np.zeros(vocab.size, bool)
    for tid in vocab.ids.tolist():
        brute[tid] = probed.advance_bytes(deepest, vocab.token_bytes[tid]) is not None
    assert np.array_equal(probed.allowed(deepest), brute)


def test_a_fixed_strings_piece_walks_as_its_nfa_does():
    """A terminal that is one fixed string is a LiteralPiece (no NFA built); a probe of it gives the answers of a
    probe of the same terminal's NFA piece: over every cut of its UTF-8 bytes, each byte swapped for a byte that
    starts, continues or breaks a character, and text after it, from every offset (the vocabulary seldom holds a
    token reaching a key's multi-byte character)."""
    from radixlang.runtime.constrained.regex import regex_ast as ra

    for text in ['"é"', "a€b", "𝄞x", "set", "ω"]:
        node = ra.literal(text)
        fixed = LexerProbe([node], ["T"], False)
        assert isinstance(fixed._pieces[0], LiteralPiece), text
        nfa = LexerProbe([node], ["T"], False, {node: ProbePiece(node)})
        data = text.encode()
        cases = {data[:k] for k in range(len(data) + 1)} | {data + tail for tail in (b"x", b'"', b"\xc3", b"\xc3\xa9")}
        cases |= {data[:k] + bytes([v]) + data[k + 1:] for k in range(len(data))
                  for v in (0x41, 0x22, 0x80, 0xA9, 0xBF, 0xC3, 0xE2, 0xF0, 0xFF)}
        for case in sorted(cases):
            for i in range(len(case)):
                assert fixed._walk(case, i) == nfa._walk(case, i), (text, case, i)
