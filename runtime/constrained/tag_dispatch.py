"""A structural tag's DFA glued from parts, without a subset construction over the whole.

When a tag set is regular and simple enough (one trigger, begins that stay apart after it, bodies that
end at their end marker), the joint automaton needs no determinization: it is the free-text DFA, whose
"trigger just completed" state becomes the root of a byte trie of the begins' remainders, whose leaves
are the start states of each tag's own DFA (schema + end marker), whose final states act as the free
text's start again (or end, or lead through the separator back to the trie root). Each tag's DFA is kept
by content in the engine's DFA cache, so a request with a new mix of known tools costs a few array
copies; a tool seen for the first time costs its own schema's compile only.
"""
from __future__ import annotations

import json
from typing import Any

import numpy as np

from .regex import regex_ast as ra
from .regex.automaton import Dfa, compile_dfa
from .regex.dfa_cache import cached
from .jsonschema.json_schema import compile_json_schema


class _NotRegular(Exception):
    """A tag's schema recurses: the general path (rules, LALR) takes the whole tag set."""


def glued_dfa(tag: Any, free_text: Any, whitespace: str | None, relaxed: frozenset[str]) -> Dfa | None:
    """The tag set's DFA (see the module doc), or None when the general path must build it."""
    triggered = tag.triggers is not None
    if triggered and (len(tag.triggers) != 1 or tag.at_least_one):
        return None
    trigger = tag.triggers[0].encode() if triggered else b""
    rests = [t.begin.encode()[len(trigger):] for t in tag.tags]
    if not _prefix_free(rests):
        return None
    try:
        bodies = [_body(t, whitespace, relaxed) for t in tag.tags]
    except (_NotRegular, ValueError):  # the general path compiles it again, or names the bad tag
        return None
    if any(((b.trans >= 0).any(axis=1) & (b.accept >= 0)).any() for b in bodies):
        return None  # a body may go on after its end marker: no state of it is simply "done"
    free = compile_dfa([free_text, ra.seq(free_text, ra.literal(tag.triggers[0]))]) if triggered else None
    if free is not None:
        done = np.flatnonzero(free.accept == 1)
        if len(done) != 1 or (free.trans[done[0]] >= 0).any():
            return None
    return _Glue(tag, free, rests, bodies).dfa()


def _prefix_free(rests: list[bytes]) -> bool:
    if any(not r for r in rests):
        return False
    ordered = sorted(rests)
    return all(not b.startswith(a) for a, b in zip(ordered, ordered[1:]))


def _body(t: Any, whitespace: str | None, relaxed: frozenset[str]) -> Dfa:
    """A tag's schema + end marker as a byte DFA, kept by content (a recursive schema raises)."""
    def build() -> Dfa:
        grammar = compile_json_schema(t.schema, whitespace, relaxed)
        if grammar.rules:
            raise _NotRegular
        return compile_dfa([ra.seq(grammar.root, ra.literal(t.end))])
    key = ("structural_tag_body", json.dumps(t.schema, sort_keys=True), t.end, whitespace, tuple(sorted(relaxed)))
    return cached(key, build)


class _Glue:
    """Lays the parts out in one table over all 256 bytes, then merges equal byte columns."""

    def __init__(self, tag: Any, free: Dfa | None, rests: list[bytes], bodies: list[Dfa]):
        self.tag, self.free, self.rests, self.bodies = tag, free, rests, bodies
        self.rows: list[np.ndarray] = []
        self.accept: list[int] = []
        self.explicit = np.zeros(256, np.int64)  # bytes of the trie and separator edges, each its own id

    def new(self, accept: int = -1) -> int:
        self.rows.append(np.full(256, -1, np.int64))
        self.accept.append(accept)
        return len(self.rows) - 1

    def block(self, dfa: Dfa, accept: np.ndarray) -> int:
        """Copies a DFA in; returns its offset."""
        offset = len(self.rows)
        full = dfa.trans[:, dfa.byte_class].astype(np.int64)
        full[full >= 0] += offset
        self.rows.extend(full)
        self.accept.extend(int(a) for a in accept)
        return offset

    def dfa(self) -> Dfa:
        tag = self.tag
        if self.free is not None:
            free_at = self.block(self.free, np.where(self.free.accept == 0, 0, -1))
            root = free_at + int(np.flatnonzero(self.free.accept == 1)[0])
            start = free_at + self.free.start
        else:
            root = self.new()
            start = root if tag.at_least_one else self.new(0)
        offsets = [self.block(b, np.where(b.accept >= 0, 0, -1)) for b in self.bodies]
        self._trie(root, offsets)
        after = self._after_tag(root, start)
        if self.free is None and start != root:
            self.rows[start] = self.rows[root].copy()
        for body, offset in zip(self.bodies, offsets):
            for final in np.flatnonzero(body.accept >= 0):
                if after is not None:
                    self.rows[offset + final] = self.rows[after].copy()
        return Dfa(*self._columns(), start)

    def _columns(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(trans, accept, byte_class): bytes that every part reads alike share a column (cheaper
        than comparing the table's 256 columns)."""
        parts = [d.byte_class for d in ([self.free] if self.free is not None else []) + self.bodies]
        keys = np.stack([*parts, self.explicit], axis=1)  # [256, parts + 1]
        _, first, byte_class = np.unique(keys, axis=0, return_index=True, return_inverse=True)
        table = np.stack(self.rows)[:, first]
        return table.astype(np.int32), np.array(self.accept, np.int32), byte_class.ravel().astype(np.intp)

    def _trie(self, root: int, offsets: list[int]) -> None:
        """Each begin's remainder, byte by byte from `root`, into its body's start state."""
        for rest, body, offset in zip(self.rests, self.bodies, offsets):
            state = root
            self.explicit[list(rest)] = np.array(list(rest)) + 1
            for b in rest[:-1]:
                nxt = int(self.rows[state][b])
                if nxt < 0:
                    nxt = self.new()
                    self.rows[state][b] = nxt
                state = nxt
            self.rows[state][rest[-1]] = offset + body.start

    def _after_tag(self, root: int, start: int) -> int | None:
        """The state whose row a finished tag takes: the free text's start, the separator's first
        state, or none (the output ends)."""
        tag = self.tag
        if tag.stop_after_first:
            return None
        if self.free is not None:
            return start
        sep = tag.separator.encode()
        if not sep:
            return root
        self.explicit[list(sep)] = np.array(list(sep)) + 1
        head = self.new()
        state = head
        for b in sep[:-1]:
            nxt = self.new()
            self.rows[state][b] = nxt
            state = nxt
        self.rows[state][sep[-1]] = root
        return head
