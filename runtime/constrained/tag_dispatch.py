"""A structural tag's DFA glued from parts, each tag's part built only when decoding reaches it.

When a tag set is regular and simple enough (one trigger, begins that stay apart after it, bodies that
end at their end marker), the joint automaton needs no determinization: it is the free-text DFA, whose
"trigger just completed" state becomes the root of a byte trie of the begins' remainders, whose leaves
lead into each tag's own DFA (schema + end marker), whose final states act as the free text's start
again (or end, or lead through the separator back to the trie root).

A request lists many tools and calls one or two, and a tag's DFA (a subset construction over its
schema) is the costly part. So a leaf starts as an unbuilt row (token_index.Unbuilt); the first token
walk, byte walk or jump-forward that reaches it builds that tag's DFA and appends it to the table.
Built rows never change, so kept masks and matchers' states stay valid as the table grows. Compiling a
request costs the schemas' regex trees (which check that each compiles: a bad schema is still refused
up front, naming its tag), the trie and the first mask. Each tag's DFA is kept by content in the
engine's DFA cache, so a tool seen before costs a table copy.
"""
from __future__ import annotations

import functools
import json
import threading

import numpy as np

from ..config import TAG_ROOT_CACHE_SIZE
from .growing_dfa import GrowingDfa
from .jsonschema.json_schema import compile_json_schema
from .masks.token_index import TokenIndex
from .masks.vocab import TokenVocab
from .regex import regex_ast as ra
from .regex.automaton import Dfa, compile_dfa
from .regex.dfa_cache import cached
from .structural_tag import StructuralTag, Tag, free_text

JSON_BLANKS = " \t\n\r"


class _NotGlueable(Exception):
    """A tag's body may go on after its end marker: the general path takes the whole tag set."""


def dispatch_constraint(tag: StructuralTag, whitespace: str | None, relaxed: frozenset[str],
                        vocab: TokenVocab) -> "TagDispatch | None":
    """The tag set as a lazily glued DFA (see the module doc), or None when the general path must build it."""
    if tag.triggers is not None and (len(tag.triggers) != 1 or tag.at_least_one):
        return None
    first = tag.triggers[0] if tag.triggers is not None else None  # None: separator mode
    trigger = first.encode() if first is not None else b""
    rests = [t.begin.encode()[len(trigger):] for t in tag.tags]
    if not _prefix_free(rests):
        return None
    found = [_regular_root(json.dumps(t.schema), whitespace, relaxed) for t in tag.tags]
    roots = [root for root in found if root is not None]
    if len(roots) < len(found):  # the general path compiles it again, or names the bad tag
        return None
    free = cached(("free_text", first, vocab.size), lambda: FreeText(first, vocab)) if first is not None else None
    if free is not None:
        done = np.flatnonzero(free.dfa.accept == 1)
        if len(done) != 1 or (free.dfa.trans[done[0]] >= 0).any():
            return None
    try:
        return TagDispatch(tag, free, rests, roots, whitespace, relaxed, vocab)
    except _NotGlueable:
        return None


def _prefix_free(rests: list[bytes]) -> bool:
    if any(not r for r in rests):
        return False
    ordered = sorted(rests)
    return all(not b.startswith(a) for a, b in zip(ordered, ordered[1:]))


@functools.lru_cache(maxsize=TAG_ROOT_CACHE_SIZE)
def _regular_root(schema_text: str, whitespace: str | None, relaxed: frozenset[str]) -> ra.Node | None:
    """A tag's schema as a regex tree (kept by its text: the same tools come back request after
    request), or None when it needs rules (it recurses) or does not compile."""
    try:
        grammar = compile_json_schema(json.loads(schema_text), whitespace, relaxed, strict=True)  # as structural_tag
    except ValueError:
        return None
    return None if grammar.rules else grammar.root


def _closed(t: Tag, whitespace: str | None) -> bool:
    """Whether no text of the tag's body goes on after its end marker, known without building it: an
    object or array ends at its bracket, and only blanks (when allowed) could follow it, which an end
    marker that begins with a non-blank rules out. Other tags are built up front and checked."""
    bracketed = isinstance(t.schema, dict) and t.schema.get("type") in ("object", "array")
    return bracketed and (whitespace is None or (t.end != "" and t.end[0] not in JSON_BLANKS))


def _body(t: Tag, root: ra.Node, whitespace: str | None, relaxed: frozenset[str]) -> Dfa:
    """A tag's schema + end marker as a byte DFA, kept by content."""
    key = ("structural_tag_body", json.dumps(t.schema), t.end, whitespace, tuple(sorted(relaxed)))
    return cached(key, lambda: compile_dfa([ra.seq(root, ra.literal(t.end))]))


class FreeText:
    """Free text up to a trigger (label 0: free, label 1: the trigger just completed), and its states'
    masks, shared by every tag set with this trigger (kept in the DFA cache: `trans` and `accept` are
    its automaton's). A state's mask in a glued DFA is its mask here unless some token read from it goes
    on past the trigger (into the begins, which differ): then `mask` says None."""

    def __init__(self, trigger: str, vocab: TokenVocab):
        text = free_text((trigger,))
        self.dfa = compile_dfa([text, ra.seq(text, ra.literal(trigger))])
        self.exact = TokenIndex(self.dfa, vocab)
        self.open = TokenIndex(_open_after_trigger(self.dfa), vocab)  # tokens may go on past the trigger
        self._alone: dict[int, bool] = {}

    @property
    def trans(self) -> np.ndarray:
        return self.dfa.trans

    @property
    def accept(self) -> np.ndarray:
        return self.dfa.accept

    def mask(self, state: int) -> np.ndarray | None:
        alone = self._alone.get(state)
        if alone is None:
            alone = self._alone[state] = bool(np.array_equal(self.exact.packed(state), self.open.packed(state)))
        return self.exact.packed(state) if alone else None


def _open_after_trigger(dfa: Dfa) -> Dfa:
    """`dfa` where any bytes may follow the completed trigger."""
    sink = dfa.num_states
    trans = np.vstack([dfa.trans, np.full((1, dfa.trans.shape[1]), sink, dfa.trans.dtype)])
    trans[np.flatnonzero(dfa.accept == 1)] = sink
    return Dfa(trans, np.append(dfa.accept, 1).astype(dfa.accept.dtype), dfa.byte_class, dfa.start)


class TagDispatch(GrowingDfa):
    """The glued DFA over all 256 bytes (no byte classes: it grows), built tag by tag on first reach."""

    def __init__(self, tag: StructuralTag, free: FreeText | None, rests: list[bytes], roots: list[ra.Node],
                 whitespace: str | None, relaxed: frozenset[str], vocab: TokenVocab):
        self.tag, self.free, self.roots, self.whitespace, self.relaxed = tag, free, roots, whitespace, relaxed
        self._lock = threading.Lock()
        self.edges: dict[tuple[int, int], int] = {}  # (state, byte) -> state of the trie and separator
        self.laid = 0  # states laid out so far
        if free is not None:  # its states first, so that they keep their numbers (and shared masks)
            self.laid = free.dfa.num_states
            root = int(np.flatnonzero(free.dfa.accept == 1)[0])
            start = free.dfa.start
        else:
            root = self._new()
            start = root if tag.at_least_one else self._new()
        self.leaves = {self._path(root, rest): i for i, rest in enumerate(rests)}  # unbuilt leaf -> tag
        self.after = self._after_tag(root, start)
        trans = np.full((self.laid, 256), -1, np.int32)
        accept = np.full(self.laid, -1, np.int32)
        if free is not None:
            width = free.dfa.num_states
            trans[:width] = free.dfa.trans[:, free.dfa.byte_class]
            accept[:width] = np.where(free.dfa.accept == 0, 0, -1)
        elif start != root:
            accept[start] = 0
        for (state, b), nxt in self.edges.items():
            trans[state, b] = nxt
        if free is None and start != root:
            trans[start] = trans[root]
        del self.edges, self.laid
        self.unbuilt = np.zeros(len(trans), bool)
        self.unbuilt[list(self.leaves)] = True
        self.dfa, self.vocab = Dfa(trans, accept, start=start), vocab
        self.index = TokenIndex(self.dfa, vocab, unbuilt=self.unbuilt)
        eager = [leaf for leaf, i in self.leaves.items() if not _closed(tag.tags[i], whitespace)]
        if eager:
            self._build(eager)

    # ---- laying out the dispatch part -------------------------------------------------------------
    def _new(self) -> int:
        self.laid += 1
        return self.laid - 1

    def _path(self, state: int, text: bytes, last: int | None = None) -> int:
        """`text` byte by byte from `state`, sharing the trie's edges; returns where it ends (`last`,
        when given, is the state its last byte leads to)."""
        for i, b in enumerate(text):
            nxt = self.edges.get((state, b))
            if nxt is None:
                nxt = self.edges[(state, b)] = last if last is not None and i == len(text) - 1 else self._new()
            state = nxt
        return state

    def _after_tag(self, root: int, start: int) -> int | None:
        """The state whose row a finished tag takes: the free text's start, the separator's first
        state, or none (the output ends)."""
        tag = self.tag
        if tag.stop_after_first:
            return None
        if tag.triggers is not None:
            return start
        sep = tag.separator.encode()
        if not sep:
            return root
        head = self._new()
        self._path(head, sep, last=root)
        return head

    # ---- building a tag on first reach --------------------------------------------------------------
    def _build(self, leaves: int | list[int] | np.ndarray) -> None:
        """Appends the DFAs of the tags whose leaves are given (those not built yet), and makes each
        leaf's row its tag's start row."""
        with self._lock:
            trans, accept, unbuilt = self.dfa.trans, self.dfa.accept, self.unbuilt.copy()
            for leaf in (int(x) for x in np.atleast_1d(leaves)):
                if not unbuilt[leaf]:
                    continue
                t = self.tag.tags[self.leaves[leaf]]
                body = _body(t, self.roots[self.leaves[leaf]], self.whitespace, self.relaxed)
                finals = np.flatnonzero(body.accept >= 0)
                if (body.trans[finals] >= 0).any():
                    raise _NotGlueable  # only up front: a tag built lazily is _closed
                offset = len(trans)
                full = body.trans[:, body.byte_class].astype(np.int32)
                full[full >= 0] += offset
                if self.after is not None:
                    full[finals] = trans[self.after]
                trans = np.vstack([trans, full])
                accept = np.concatenate([accept, np.where(body.accept >= 0, 0, -1).astype(np.int32)])
                trans[leaf], accept[leaf] = full[body.start], accept[offset + body.start]
                unbuilt = np.concatenate([unbuilt, np.zeros(len(full), bool)])
                unbuilt[leaf] = False
            dfa = Dfa(trans, accept, start=self.dfa.start)
            # in this order: a reader that sees the new table also sees the new marks
            self.unbuilt = unbuilt
            self.dfa = dfa
            self.index = self.index.grown(dfa, unbuilt)

    def _packed(self, state: int) -> np.ndarray:
        if self.free is not None and state < self.free.dfa.num_states:
            shared = self.free.mask(state)
            if shared is not None:
                return shared
        return super()._packed(state)
