"""Sampling params -> a compiled constraint, LRU-cached per engine (compiling a pattern is the cost)."""
from __future__ import annotations

import json
import threading
import time
from collections import OrderedDict
from typing import Callable

from ..config import CONSTRAINT_CACHE_SIZE, CONSTRAINT_PRECOMPUTE_MS
from . import deadline
from .backends import Encode, PeerCompiler, check_installed, peer_compiler
from .ebnf import parse_ebnf
from .grammar.constraint import GrammarConstraint
from .grammar.lalr import build_lark
from .grammar.rule_grammar import rules_grammar
from .growing_dfa import GrowingDfa
from .jsonschema.contract import KeepsOrder
from .jsonschema.json_objects import ANY_MARKER_PATH
from .jsonschema.json_schema import (
    JsonGrammar,
    Relaxed,
    compile_json_schema,
    relaxed_keywords,
    schema_to_dict,
    whitespace_node,
)
from .jsonschema.unique_walk import UniqueWalk
from .marker_tokens import with_marker_tokens
from .masks.vocab import TokenVocab
from .matcher import Constraint, RegexConstraint
from .object_dispatch import NotLazy, ObjectDispatch
from .regex.automaton import collector_paused, compile_dfa
from .regex.dfa_cache import DfaCache, caching
from .regex.regex_parser import parse_regex
from .structural_tag import parse_structural_tag, structural_tag_grammar
from .tag_dispatch import dispatch_constraint
from .think import ThinkParts, ThinkThen
from .unique_items import UniqueItems, vocab_classes
from .warming import warm, warm_seconds

JSON_SCHEMA_KINDS = ("json_schema", "json_schema_strict")
# states of a JSON schema's one DFA (its own semantics) past which it compiles in the strict form instead: on
# JSONSchemaBench's 300 (--per-subset 30) the largest that compile read 17,250 states (package.manifest),
# while o35155 (a union of 14 open objects with searched patterns) built 100,000 (MAX_DFA_STATES) in ~2.5 s
# before its strict form (0.16 s)
JSON_REGEX_MAX_STATES = 30_000


class ConstraintCompiler:
    """Compiles regex / JSON schema / Lark / EBNF constraints against one vocabulary; thread-safe."""

    def __init__(self, make_vocab: Callable[[], TokenVocab], json_whitespace: str | None = None,
                 cache_size: int = CONSTRAINT_CACHE_SIZE, json_relaxed: Relaxed = (),
                 compile_timeout: float | None = None, backend: str = "radixlang", encode: Encode | None = None,
                 precompute_ms: float = CONSTRAINT_PRECOMPUTE_MS):
        """`compile_timeout`: seconds one compile (to its first mask) may take (deadline.py); None: no limit.
        `precompute_ms`: what a compile then spends on the masks of the states nearest its start (warming.py).
        `backend`: radixlang (ours), or a peer library that compiles every constraint (backends.py), which
        may ask the tokenizer (`encode`) how text is split."""
        whitespace_node(json_whitespace)  # a bad pattern fails here, when the engine starts
        if backend != "radixlang":
            check_installed(backend)  # a missing package fails here too, naming the extra
        self.backend = backend
        self._peer: PeerCompiler | None = None  # built with the vocabulary, on first use
        self._encode = encode
        self.json_relaxed = relaxed_keywords(json_relaxed)
        self._make_vocab = make_vocab
        self._vocab: TokenVocab | None = None
        self.json_whitespace = json_whitespace
        self.cache_size = cache_size
        self.compile_timeout = compile_timeout
        self.precompute_s = precompute_ms / 1e3
        self._cache: OrderedDict[tuple[str, str], Constraint] = OrderedDict()
        self._dfas = DfaCache()  # sub-languages shared by this engine's compiles (and their lexers)
        self._think_parts: dict[tuple[str, str], ThinkParts] = {}  # per reasoning marker pair (a few)
        self._lock = threading.Lock()

    @property
    def vocab(self) -> TokenVocab:
        with self._lock:
            if self._vocab is None:
                self._vocab = self._make_vocab()
            return self._vocab

    def compile(self, kind: str, spec: object) -> Constraint:
        """`kind` is 'regex', 'json_schema', 'json_schema_strict' (OpenAI's strict form: objects in declared
        order, closed unless the schema opens them), 'grammar', 'ebnf' or 'structural_tag'. Raises
        ValueError for a bad spec."""
        text = _cache_text(kind, spec)
        key = (kind, text)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None and not (isinstance(hit, (GrowingDfa, GrammarConstraint, UniqueItems)) and hit.outgrown):
                self._cache.move_to_end(key)
                return hit
        vocab = self.vocab  # outside the deadline: built once per engine, not a request's cost
        if self.backend == "radixlang":
            vocab.native_trie
            if kind in JSON_SCHEMA_KINDS:
                vocab_classes(vocab)  # what the uniqueItems scan reads of the vocabulary
        else:
            self._peer_compiler()
        with collector_paused(), caching(self._dfas):
            began = time.perf_counter()
            with deadline.limit(self.compile_timeout, kind):
                constraint = self._build(kind, spec, text)
                start = constraint.initial()
                if not constraint.can_end(start) and not constraint.allowed(start).any():
                    raise ValueError(f"{kind} matches no text that the vocabulary can spell")
            # its own budget, past the deadline's reach: it never refuses; a uniqueItems scan's masks are its inner's
            warm(constraint.inner if isinstance(constraint, UniqueItems) else constraint,
                 warm_seconds(self.precompute_s, time.perf_counter() - began))
        with self._lock:
            self._cache[key] = constraint
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return constraint

    def think_then(self, inner: Constraint | None, start: str, end: str, budget: int | None,
                   opened: bool) -> Constraint:
        """`inner` (None: free text) after a thinking block between `start` and `end` (see think.py): the
        block is opened first unless the prompt `opened` it, and closed after `budget` thinking tokens.
        Cheap per request: the markers' automata are built once and shared."""
        key = (start, end)
        with self._lock:
            parts = self._think_parts.get(key)
        if parts is None:
            vocab = self.vocab
            with collector_paused(), caching(self._dfas):
                parts = ThinkParts.build(start, end, vocab)
            with self._lock:
                parts = self._think_parts.setdefault(key, parts)
        return ThinkThen(parts, inner, budget, opened, self.vocab)

    def _build(self, kind: str, spec: object, text: str) -> Constraint:
        """`text`: the spec's cache text, which for a regex or grammar is the spec itself."""
        vocab = self.vocab
        if self.backend != "radixlang":
            return self._peer_compiler().compile(kind, spec, text)
        if kind == "regex":
            return RegexConstraint(compile_dfa([parse_regex(text)]), vocab)
        if kind == "grammar":
            return GrammarConstraint(build_lark(text), vocab)
        if kind == "ebnf":
            ebnf = parse_ebnf(text)
            if not ebnf.rules:  # a regular grammar: one DFA
                return RegexConstraint(compile_dfa([ebnf.root]), vocab)
            return GrammarConstraint(rules_grammar(ebnf.root, ebnf.rules, "ebnf"), vocab)
        if kind == "structural_tag":
            tag = parse_structural_tag(spec)
            relaxed = self.json_relaxed | {"uniqueItems"}  # no scan reads a tag's JSON: left unenforced there, as before
            glued: Constraint | None = dispatch_constraint(tag, self.json_whitespace, relaxed, vocab)
            if glued is None:
                glued = _built(structural_tag_grammar(tag, self.json_whitespace, relaxed), vocab)
            return with_marker_tokens(glued, tag)
        assert kind in JSON_SCHEMA_KINDS, f"unknown constraint kind {kind}"
        if kind == "json_schema_strict":
            return self._json_schema(spec, strict=True)
        try:
            return self._json_schema(spec)
        except ValueError as e:  # e.g. open objects in a union of recursive ones: an ambiguous grammar
            if "no value can satisfy" in str(e) or isinstance(e, deadline.CompileDeadline):
                raise  # the strict form's values are a subset: none either; or no time is left
            try:  # the strict form's values are a subset of the schema's: narrower, never wrong
                return self._json_schema(spec, strict=True, note=f"any property order and undeclared properties "
                                                                  f"(strict form: {e})")
            except ValueError:
                raise e from None

    def _json_schema(self, spec: object, strict: bool = False, note: str | None = None) -> Constraint:
        """The schema's constraint (`strict`: OpenAI's form), reporting `note` first where given. Its large
        objects take any order, built lazily (object_dispatch), where they start apart from all else."""
        not_lazy: frozenset[str] = frozenset()
        unique = "uniqueItems" not in self.json_relaxed  # enforced around the grammar (unique_items.py)
        relaxed = self.json_relaxed | {"uniqueItems"} if unique else self.json_relaxed

        def compiled(lazy_objects: bool = False, not_lazy: frozenset[str] = frozenset(),
                     checked_objects: bool = True, rules_form: bool = False, any_order: bool = False) -> JsonGrammar:
            grammar = compile_json_schema(spec, self.json_whitespace, relaxed, strict=strict, lazy_objects=lazy_objects,
                                          not_lazy=not_lazy, checked_objects=checked_objects, rules_form=rules_form,
                                          any_order=any_order)
            if unique:  # the grammar's reports of it are replaced by the scan's own
                grammar.unenforced = tuple(r for r in grammar.unenforced if not r.startswith("uniqueItems at "))
            if note is not None:
                grammar.unenforced = (note, *grammar.unenforced)
            return grammar

        any_order_tried = False  # the grammar below is the same whatever `not_lazy` says: built once at most
        while True:
            grammar = compiled(lazy_objects=not strict, not_lazy=not_lazy)
            built: Constraint
            if not grammar.lazy and grammar.any_level is None:
                try:
                    built = _built(grammar, self.vocab, None if strict else JSON_REGEX_MAX_STATES)
                except ValueError:
                    if not grammar.checks:
                        raise
                    # checked objects made the grammar fail (a lexer too large): declared order for them
                    built = _built(compiled(checked_objects=False), self.vocab)
                break
            try:  # till the grammar below is tried, its first clash is enough to go to it
                built = self._object_dispatch(grammar, first_clash=not any_order_tried)
            except NotLazy as e:
                if e.paths == {ANY_MARKER_PATH}:  # only undeclared values clash: they nest a bounded depth instead
                    not_lazy |= e.paths
                    continue
                # objects that cannot be lazy (a union of them, say): as a grammar they take any order, checked by
                # the parser; where that too would keep some in declared order, they keep it in the one DFA,
                # each round taking one or two out
                ruled = None if any_order_tried else self._any_order_grammar(lambda: compiled(rules_form=True,
                                                                                               any_order=True))
                any_order_tried = True
                if ruled is not None:
                    built = ruled
                    break
                not_lazy |= e.paths if e.complete else self._clashes(grammar)
                continue
            built.unenforced = grammar.unenforced
            break
        return _with_unique_items(built, schema_to_dict(spec)) if unique else built

    def _object_dispatch(self, grammar: JsonGrammar, first_clash: bool = False) -> ObjectDispatch:
        return ObjectDispatch(grammar.root, grammar.lazy, self.vocab, grammar.any_level, first_clash=first_clash)

    def _clashes(self, grammar: JsonGrammar) -> frozenset[str]:
        """Every object of `grammar` that cannot be lazy (after a NotLazy that stopped at the first)."""
        try:
            self._object_dispatch(grammar)
        except NotLazy as e:
            return e.paths
        raise AssertionError("a grammar that clashed once clashes again")

    def _any_order_grammar(self, make: Callable[[], JsonGrammar]) -> Constraint | None:
        """The schema as a grammar whose large objects all take any order (`make`'s, checked by the parser), or
        None where it cannot be one (it keeps some object in declared order, or fails to build)."""
        try:
            return _built(make(), self.vocab)  # `make` raises KeepsOrder at the first object kept in declared order
        except deadline.CompileDeadline:
            raise
        except (ValueError, KeepsOrder):
            return None

    def _peer_compiler(self) -> PeerCompiler:
        with self._lock:
            if self._peer is None:
                assert self._vocab is not None, "compile() builds the vocabulary first"
                self._peer = peer_compiler(self.backend, self._vocab, self.json_whitespace, self._encode)
            return self._peer


def _built(grammar: JsonGrammar, vocab: TokenVocab, max_states: int | None = None) -> Constraint:
    """One DFA (of at most `max_states`: compile_dfa) when the grammar has no rules, else the LALR engine;
    either reports the keywords it leaves unenforced (`unenforced`)."""
    built: RegexConstraint | GrammarConstraint
    if not grammar.rules:
        built = RegexConstraint(compile_dfa([grammar.root], max_states=max_states), vocab)
    else:
        built = GrammarConstraint(rules_grammar(grammar.root, grammar.rules, checks=grammar.checks), vocab)
    built.unenforced = grammar.unenforced
    return built


def _with_unique_items(built: Constraint, schema: dict | bool) -> Constraint:
    """`built` held to `uniqueItems` where the schema asks it (unique_items.py); the arrays left open by a
    union whose other branches allow repeats are reported."""
    walk = UniqueWalk(schema)
    if not walk.unique:
        return built
    report = walk.report()
    if not walk.enforces:
        built.unenforced = (*unenforced(built), *report)  # type: ignore[attr-defined]
        return built
    return UniqueItems(built, walk, (*unenforced(built), *report))


def unenforced(constraint: object) -> tuple[str, ...]:
    """The relaxed JSON-schema keywords a compiled constraint does not enforce, as "<keyword> at <path>"
    (the engine's constrained_json_relaxed); () for other constraints."""
    return getattr(constraint, "unenforced", ())


def _cache_text(kind: str, spec: object) -> str:
    if kind in JSON_SCHEMA_KINDS:
        return json.dumps(schema_to_dict(spec))  # key order is property order: it matters
    if kind == "structural_tag":
        return parse_structural_tag(spec).canonical()
    if not isinstance(spec, str):
        raise ValueError(f"{kind} must be a string, got {type(spec).__name__}")
    return spec
