"""Regex trees -> byte-level DFAs: determinized over code-point classes, then expanded to UTF-8.

The subset construction and minimization run over a regex's code-point classes (alphabet), which
keeps them small even for Unicode classes; `utf8` then turns each character transition into byte
transitions.

A `Dfa` reads raw bytes. `trans[s, byte_class[b]]` is the next state or -1 (dead): the columns are
byte classes (bytes every state reads alike; see utf8). Every live state can still reach an accepting
one (dead ends are trimmed), so "alive" always means "completable". `accept[s]` is the index of the
preferred pattern that accepts in s (the lowest index), or -1. It is minimal.
"""
from __future__ import annotations

import contextlib
import gc
from dataclasses import dataclass, field
from typing import Callable, Iterator

import numpy as np

from ...config import MAX_DFA_STATES
from .. import deadline
from . import regex_ast as ra
from .alphabet import Alphabet, CharDfa, alphabet_of, owning_classes
from .dfa_cache import cached, current
from .fsa import Nfa, determinize, heights, minimize, row_ids, state_id, too_large, trim
from .tiling import Tile, expand, item_rows
from .utf8 import char_to_byte_dfa


def _every_byte() -> np.ndarray:
    return np.arange(256, dtype=np.intp)


@dataclass(slots=True)
class Dfa:
    trans: np.ndarray  # [S, K] int32 over byte classes, -1 = dead
    accept: np.ndarray  # [S] int32, -1 = not accepting, else the accepted pattern's index
    byte_class: np.ndarray = field(default_factory=_every_byte)  # [256] intp: each byte's column
    start: int = 0
    readings: tuple[tuple[int, ...], ...] = ()  # compile_dfa(readings=True)'s: by label, every pattern it accepts

    @property
    def num_states(self) -> int:
        return int(self.trans.shape[0])

    def step(self, state: int, b: int) -> int:
        """The state after byte `b`, or -1."""
        return int(self.trans[state, self.byte_class[b]])

    def row(self, state: int) -> np.ndarray:
        """[256] the state after each byte (-1: dead)."""
        return self.trans[state][self.byte_class]

    def walk(self, state: int, data: bytes) -> int:
        """The state after `data`, or -1."""
        trans, byte_class = self.trans, self.byte_class
        for b in data:
            state = int(trans[state, byte_class[b]])
            if state < 0:
                return -1
        return state

    def is_finite(self) -> bool:
        """Whether the language is finite (no cycle among live states)."""
        color = np.zeros(self.num_states, np.int8)
        stack = [(self.start, iter(np.unique(self.trans[self.start][self.trans[self.start] >= 0])))]
        color[self.start] = 1
        while stack:
            state, children = stack[-1]
            child = next(children, None)
            if child is None:
                color[state] = 2
                stack.pop()
            elif color[child] == 1:
                return False
            elif color[child] == 0:
                color[child] = 1
                row = self.trans[child]
                stack.append((int(child), iter(np.unique(row[row >= 0]))))
        return True


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """Building automata allocates many small containers, freed by reference counting; the cyclic
    collector's passes over the process's long-lived objects (tokenizer, model) took a third of the time."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def compile_dfa(patterns: list[ra.Node], nonempty: bool = False, readings: bool = False,
                max_states: int | None = None) -> Dfa:
    """One DFA for the union of `patterns`; `nonempty` drops the empty match (lexer terminals). A state
    accepting several patterns is labelled by the first, or with `readings`, by the tuple of all of them
    (`Dfa.readings[label]`). `max_states` bounds the subset construction below MAX_DFA_STATES (where the
    caller has a cheaper form to fall back on: ConstraintTooLarge past it)."""
    def build() -> Dfa:
        chars = own_chars(patterns, nonempty, readings, max_states)
        trans, byte_class, accept = char_to_byte_dfa(chars)
        return Dfa(trans, accept, byte_class, readings=chars.readings)
    return cached(_dfa_key(patterns, nonempty, readings), build)


def _dfa_key(patterns: list[ra.Node], nonempty: bool, readings: bool) -> tuple:
    return ("bytes", tuple(patterns), nonempty, readings) if readings else ("bytes", tuple(patterns), nonempty)


def compiled_before(patterns: list[ra.Node], nonempty: bool = False, readings: bool = False) -> bool:
    """Whether `compile_dfa(patterns, ...)` would find its DFA in the installed cache (so costs no construction)."""
    cache = current()
    return cache is not None and _dfa_key(patterns, nonempty, readings) in cache


def compile_chars(patterns: list[ra.Node], alphabet: Alphabet, nonempty: bool = False) -> CharDfa:
    """`compile_dfa` over `alphabet`'s classes (which must cover the patterns' character sets)."""
    return _project(own_chars(patterns, nonempty), alphabet)


def own_chars(patterns: list[ra.Node], nonempty: bool, readings: bool = False,
              max_states: int | None = None) -> CharDfa:
    """The character DFA over the patterns' own alphabet, built once per content (dfa_cache; a bound
    is not in the key: what it lets through is the same DFA)."""
    key = ("chars", tuple(patterns), nonempty, readings) if readings else ("chars", tuple(patterns), nonempty)
    return cached(key, lambda: _determinize(patterns, alphabet_of(char_sets(patterns)), nonempty, readings,
                                            max_states))


def thompson(patterns: list[ra.Node], alphabet: Alphabet, nonempty: bool,
             embedded: list[tuple[int, int, CharDfa]] | None = None,
             tiled: dict[ra.Node, int] | None = None) -> tuple[Nfa, int]:
    """The NFA (and its start) that `compile_dfa` determinizes: pattern i's end accepts label i; with
    `nonempty` the start is a state of its own that nothing leads back into. Given `embedded` (a list), a
    compiled DFA (`ra.Compiled`) is not copied in state by state: (entry, exit, dfa) is appended there instead,
    and the caller walks the DFA itself between the two states (lexer_probe). Given `tiled`, each repeat there
    reads its symbol once (see tiling), or nothing where its min is 0."""
    builder = _Builder(alphabet, embedded, tiled)
    nfa = builder.nfa
    start = nfa.new()
    body = start
    if nonempty:  # a start state nothing leads back into, so its acceptance can be dropped alone
        body = nfa.new()
        nfa.eps[start].append(body)
    for label, pattern in enumerate(patterns):
        s = nfa.new()
        nfa.eps[body].append(s)
        nfa.accepts[builder.build(pattern, s)] = label
    return nfa, start


def _determinize(patterns: list[ra.Node], alphabet: Alphabet, nonempty: bool, readings: bool = False,
                 max_states: int | None = None) -> CharDfa:
    """The patterns' minimal DFA: long repeats tiled (see tiling) where they can be, else all unrolled."""
    width = len(alphabet.classes)
    tiles = _tiles(patterns, alphabet)
    if tiles:
        sets: list[tuple[int, ...]] = []
        nfa, start = thompson(patterns, alphabet, nonempty, tiled={node: width + j for j, node in enumerate(tiles)})
        skeleton = determinize(nfa, start, width + len(tiles), drop_start_accept=nonempty,
                               readings=sets if readings else None, limit=max_states)
        built = expand(*skeleton, width, list(tiles.values()))
        if built is not None:
            trans, accept = minimize(*built)
            if len(trans) > (limit := MAX_DFA_STATES if max_states is None else max_states):
                raise too_large(limit)
            return CharDfa(trans, accept, alphabet, readings=tuple(sets))
    sets = []
    nfa, start = thompson(patterns, alphabet, nonempty)
    trans, accept = determinize(nfa, start, width, drop_start_accept=nonempty, readings=sets if readings else None,
                                limit=max_states)
    return CharDfa(trans, accept, alphabet, readings=tuple(sets))


_TILED_MIN_COPIES = 16  # bounded repeats from this many copies are tiled: shorter ones unroll as cheaply
# a lexer probe's bounded repeats from this many copies are embedded as their own tiled DFA (~1 ms, then ~1.5 us a
# copy) rather than unrolled (~6 us a copy)
EMBEDDED_REPEAT_MIN_COPIES = 256
_EMBED_CHUNK = 16_384  # edges an embedded DFA copies between two reads of the deadline clock (~3 ms)


def _tiles(patterns: list[ra.Node], alphabet: Alphabet) -> dict[ra.Node, Tile]:
    """The patterns' long bounded repeats whose item tiles (tiling.item_rows), outermost first; the insides
    of the others are searched. Repeats of one item share its rows (tiling.expand chains them together)."""
    tiles: dict[ra.Node, Tile] = {}
    rows_of: dict[ra.Node, np.ndarray | None] = {}
    stack = list(patterns)
    while stack:
        node = stack.pop()
        if isinstance(node, ra.Repeat):
            if node.max is not None and node.max >= _TILED_MIN_COPIES and node not in tiles:
                if node.item not in rows_of:
                    item = compile_chars([node.item], alphabet)
                    rows_of[node.item] = item_rows(item.trans, item.accept, item.start)
                rows = rows_of[node.item]
                if rows is not None:
                    tiles[node] = Tile(rows, max(node.min, 1), node.max)
                    continue
        if not isinstance(node, ra.Bounded):  # its item is compiled on its own (Builder._bounded), never tiled
            stack.extend(ra.children(node))
    return tiles


def _project(dfa: CharDfa, alphabet: Alphabet) -> CharDfa:
    """`dfa` over a finer `alphabet`: each of its classes lies inside one of dfa's classes, or in none
    (then it is dead everywhere). Same states, so still trimmed and minimal."""
    if dfa.alphabet.classes == alphabet.classes:
        return dfa
    trans = np.full((len(dfa.trans), len(alphabet.classes)), -1, dfa.trans.dtype)
    owner = owning_classes(alphabet, dfa.alphabet)
    inside = owner >= 0
    trans[:, inside] = dfa.trans[:, owner[inside]]
    return CharDfa(trans, dfa.accept, alphabet)


def char_sets(patterns: list[ra.Node]) -> list[ra.Ranges]:
    """Every code-point set the patterns read (the input of `alphabet_of`)."""
    out: list[ra.Ranges] = []
    stack = list(patterns)
    while stack:
        node = stack.pop()
        if isinstance(node, ra.Chars):
            out.append(node.ranges)
        elif isinstance(node, ra.Compiled):
            out.extend(node.dfa.alphabet.classes)
        else:
            stack.extend(ra.children(node))
    return out


def length_range(pattern: ra.Node) -> tuple[int, int | None]:
    """(fewest, most) characters of the pattern's matches (None: unbounded), from its character DFA (built
    once per content, dfa_cache), whose every transition reads one character. Every state of it is
    reachable and live, so the most is unbounded exactly where a cycle is, else the start's height."""
    dfa = own_chars([pattern], False)
    rows = dfa.trans.tolist()
    accept = dfa.accept.tolist()
    seen, level, fewest = {dfa.start}, [dfa.start], 0
    while level and not any(accept[q] >= 0 for q in level):  # breadth first, to the nearest acceptance
        nxt = []
        for t in (t for q in level for t in rows[q]):
            if t >= 0 and t not in seen:
                seen.add(t)
                nxt.append(t)
        level, fewest = nxt, fewest + 1
    height = {q: h for h, states in enumerate(heights(dfa.trans)) for q in states}
    return fewest, height.get(dfa.start)


def exactly_one(patterns: list[ra.Node]) -> CharDfa:
    """Strings that exactly one of `patterns` matches (JSON schema oneOf)."""
    return product("exactly_one", patterns)


def intersection(patterns: list[ra.Node]) -> CharDfa:
    """Strings that every one of `patterns` matches (JSON schema allOf, pattern with length bounds)."""
    return product("all", patterns)


def difference(keep: ra.Node, drop: ra.Node) -> CharDfa:
    """Strings that `keep` matches and `drop` does not (JSON schema `not`)."""
    return product("difference", [keep, drop])


_PRODUCT_ACCEPTS: dict[str, Callable[[list[bool]], bool]] = {
    "exactly_one": lambda hits: sum(hits) == 1,
    "all": all,
    "difference": lambda hits: hits[0] and not hits[1],
    "all_but_last": lambda hits: all(hits[:-1]) and not hits[-1],  # in all of the patterns but the last
}


def product(kind: str, patterns: list[ra.Node]) -> CharDfa:
    """The product of the patterns' DFAs; a state accepts when `_PRODUCT_ACCEPTS[kind]` holds of which
    patterns accept there. Built once per content (dfa_cache)."""
    return cached(("product", kind, tuple(patterns)), lambda: _product(patterns, _PRODUCT_ACCEPTS[kind]))


def _product(patterns: list[ra.Node], accepts: Callable[[list[bool]], bool]) -> CharDfa:
    """Only states some pattern can still leave or accept in are built, a breadth-first layer at a
    time: one gather per pattern, and a dict lookup per distinct new state."""
    alphabet = alphabet_of(char_sets(patterns))
    dfas = [compile_chars([p], alphabet) for p in patterns]
    width = len(alphabet.classes)
    dead = np.array([len(d.trans) for d in dfas])  # each pattern's extra row: its dead state
    trans_of = [np.vstack([np.where(d.trans >= 0, d.trans, n), np.full((1, width), n)]) for d, n in zip(dfas, dead)]
    start = np.array([[d.start for d in dfas]])
    keys = [start.tobytes()]
    ids = {keys[0]: 0}
    layers: list[np.ndarray] = [start]
    rows: list[np.ndarray] = []
    while len(layers) > len(rows):
        frontier = layers[len(rows)]
        nxt = np.stack([t[frontier[:, i]] for i, t in enumerate(trans_of)], axis=-1)  # [F, K, patterns]
        alive = (nxt != dead).any(axis=-1)
        targets = nxt[alive]
        local = row_ids(targets)
        _, first = np.unique(local, return_index=True)
        state = np.empty(len(first), np.int64)
        fresh = []
        for j, row in enumerate(targets[first]):
            known = len(keys)
            state[j] = state_id(ids, keys, row.tobytes())
            if state[j] == known:  # a new state: it joins the next layer
                fresh.append(row)
        row_block = np.full(alive.shape, -1, np.int64)
        row_block[alive] = state[local]
        rows.append(row_block)
        if fresh:
            layers.append(np.stack(fresh))
    order = np.concatenate(layers)
    hits = np.column_stack([np.append(d.accept, -1)[order[:, i]] >= 0 for i, d in enumerate(dfas)])
    accept = np.array([0 if accepts(h) else -1 for h in hits.tolist()])
    trans, accept = minimize(*trim(np.concatenate(rows), accept))
    return CharDfa(trans, accept, alphabet)


class _Builder:
    """Thompson construction over an alphabet's classes."""

    def __init__(self, alphabet: Alphabet, embedded: list[tuple[int, int, CharDfa]] | None = None,
                 tiled: dict[ra.Node, int] | None = None) -> None:
        self.alphabet = alphabet
        self.nfa = Nfa()
        self.embedded = embedded
        self.tiled = {node: (symbol,) for node, symbol in (tiled or {}).items()}  # one symbol tuple each (subsets)

    def build(self, node: ra.Node, s: int) -> int:
        """Adds `node` starting at state s; returns its end state."""
        nfa = self.nfa
        if isinstance(node, ra.Chars):
            end = nfa.new()
            nfa.edges[s].append((self.alphabet.members[node.ranges], end))
            return end
        if isinstance(node, ra.Seq):
            for item in node.items:
                s = self.build(item, s)
            return s
        if isinstance(node, ra.Alt):
            end = nfa.new()
            for item in node.items:
                branch = nfa.new()
                nfa.eps[s].append(branch)
                nfa.eps[self.build(item, branch)].append(end)
            return end
        if isinstance(node, ra.Repeat):
            return self._repeat(node, s)
        if isinstance(node, ra.Bounded):
            return self._bounded(node, s)
        if isinstance(node, ra.Compiled):
            return self._embed(node.dfa, s)
        if isinstance(node, ra.Graph):
            return self._graph(node, s)
        raise ValueError(f"grammar rule reference {node} cannot appear inside a regular expression")

    def _repeat(self, node: ra.Repeat, s: int) -> int:
        nfa = self.nfa
        symbol = self.tiled.get(node) if self.tiled else None
        if symbol is not None:
            end = nfa.new()
            nfa.edges[s].append((symbol, end))
            if node.min == 0:
                nfa.eps[s].append(end)
            return end
        if self.embedded is not None and node.max is not None and node.max >= EMBEDDED_REPEAT_MIN_COPIES \
                and node in _tiles([node], alphabet_of(char_sets([node]))):
            # a probe's long bounded repeat of an item that tiles (a string's maxLength: 4096) is its own DFA, tiled
            # (own_chars), walked in place: unrolled, its Thompson copies were ~6 us each, 25 ms for Snowplow sp_89's
            # one probe (an item that does not tile would be unrolled through the subset construction: kept here)
            return self._embed(own_chars([node], False), s)
        for _ in range(node.min):
            s = self.build(node.item, s)
        if node.max is None:
            loop = nfa.new()
            nfa.eps[s].append(loop)
            nfa.eps[self.build(node.item, loop)].append(loop)
            return loop
        end = nfa.new()
        nfa.eps[s].append(end)
        for _ in range(node.max - node.min):
            s = self.build(node.item, s)
            nfa.eps[s].append(end)
        return end

    def _graph(self, graph: ra.Graph, s: int) -> int:
        nfa = self.nfa
        states = [nfa.new() for _ in range(graph.num_states)]
        nfa.eps[s].append(states[0])
        end = nfa.new()
        for src, node, dst in graph.edges:
            nfa.eps[self.build(node, states[src])].append(states[dst])
        for f in graph.finals:
            nfa.eps[states[f]].append(end)
        return end

    def _embed(self, dfa: CharDfa, s: int) -> int:
        """Copies a character DFA in, entered from state s (its start may have incoming edges)."""
        nfa = self.nfa
        if self.embedded is not None:  # left to the caller, between two states of its own
            entry, end = nfa.new(), nfa.new()
            nfa.eps[s].append(entry)
            self.embedded.append((entry, end, dfa))
            return end
        first = nfa.new_many(len(dfa.trans))  # the DFA's state q is first + q
        nfa.eps[s].append(first + dfa.start)
        end = nfa.new()
        members = [self.alphabet.members[ranges] for ranges in dfa.alphabet.classes]
        for q in np.flatnonzero(dfa.accept >= 0).tolist():
            nfa.eps[first + q].append(end)
        # the live transitions only, in row order (a DFA's rows are mostly dead)
        sources, symbols = np.nonzero(dfa.trans >= 0)
        targets = dfa.trans[sources, symbols] + first
        edges = nfa.edges
        for lo in range(0, len(sources), _EMBED_CHUNK):  # a large DFA's copy reads the clock as `new` does
            deadline.check()
            part = slice(lo, lo + _EMBED_CHUNK)
            for q, c, t in zip((sources[part] + first).tolist(), symbols[part].tolist(), targets[part].tolist()):
                edges[q].append((members[c], t))
        return end

    def _bounded(self, node: ra.Bounded, s: int) -> int:
        """Unrolls the item's DFA `max_bytes` deep, so no match is longer than that."""
        nfa, widths = self.nfa, self.alphabet.widths.tolist()
        dfa = compile_chars([node.item], self.alphabet)
        end = nfa.new()
        layers: list[dict[int, int]] = [{} for _ in range(node.max_bytes + 1)]  # by bytes read: DFA -> NFA state
        layers[0][dfa.start] = s
        for depth, layer in enumerate(layers):
            for q, state in layer.items():
                if dfa.accept[q] >= 0:
                    nfa.eps[state].append(end)
                for c, t in enumerate(dfa.trans[q].tolist()):
                    if t >= 0 and depth + widths[c] <= node.max_bytes:
                        nxt = layers[depth + widths[c]]
                        if t not in nxt:
                            nxt[t] = nfa.new()
                        nfa.edges[state].append(((c,), nxt[t]))
        return end
