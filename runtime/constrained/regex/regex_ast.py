"""Regular-language syntax trees over Unicode code points, the common input of every automaton.

A `Chars` leaf is a set of code points (sorted, disjoint, inclusive ranges; surrogates never appear
because UTF-8 cannot encode them). `Ref` names a grammar rule; it appears only in JSON-schema grammars
and never reaches the DFA builder.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any, Iterable, Union

MAX_CODE_POINT = 0x10FFFF
SURROGATES = (0xD800, 0xDFFF)

Ranges = tuple[tuple[int, int], ...]


def _cached_hash(node) -> int:  # noqa: ANN001 - a composite node
    """A composite node's hash, computed once: grammars key dicts by large shared trees."""
    h = node._hash
    if not h:
        h = hash((type(node).__name__, *(getattr(node, f) for f in node.__dataclass_fields__ if f[0] != "_"))) or 1
        object.__setattr__(node, "_hash", h)
    return h


@dataclass(frozen=True, slots=True)
class Chars:
    ranges: Ranges


@dataclass(frozen=True, slots=True)
class Seq:
    items: tuple["Node", ...]
    _hash: int = field(default=0, init=False, repr=False, compare=False)
    _size: int = field(default=-1, init=False, repr=False, compare=False)  # size()'s, once asked
    _refs: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)  # refs()'s

    __hash__ = _cached_hash


@dataclass(frozen=True, slots=True)
class Alt:
    items: tuple["Node", ...]
    _hash: int = field(default=0, init=False, repr=False, compare=False)
    _size: int = field(default=-1, init=False, repr=False, compare=False)  # size()'s, once asked
    _refs: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)  # refs()'s

    __hash__ = _cached_hash


@dataclass(frozen=True, slots=True)
class Repeat:
    item: "Node"
    min: int
    max: int | None  # None: unbounded
    _hash: int = field(default=0, init=False, repr=False, compare=False)
    _size: int = field(default=-1, init=False, repr=False, compare=False)  # size()'s, once asked
    _refs: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)  # refs()'s

    __hash__ = _cached_hash


@dataclass(frozen=True, slots=True)
class Bounded:
    """`item`'s matches of at most `max_bytes` UTF-8 bytes (used to bound ignored whitespace)."""

    item: "Node"
    max_bytes: int
    _size: int = field(default=-1, init=False, repr=False, compare=False)
    _refs: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)


@dataclass(frozen=True, slots=True)
class Ref:
    name: str


@dataclass(frozen=True, slots=True, eq=False)
class Compiled:
    """A language given directly as a character DFA (`alphabet.CharDfa`), e.g. the result of a product.
    Equal when the automaton is the same object (dfa_cache hands out one object per language built)."""

    dfa: Any

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Compiled) and other.dfa is self.dfa

    def __hash__(self) -> int:
        return id(self.dfa)


@dataclass(frozen=True, slots=True)
class Graph:
    """An automaton whose edges read sub-languages: (source, node, target) over states 0..num_states-1,
    entered at 0, left at any final state. Shares each sub-language once where a tree would copy it
    (JSON objects that count their members)."""

    num_states: int
    edges: tuple[tuple[int, "Node", int], ...]
    finals: tuple[int, ...]
    _hash: int = field(default=0, init=False, repr=False, compare=False)
    _size: int = field(default=-1, init=False, repr=False, compare=False)  # size()'s, once asked
    _refs: frozenset[str] | None = field(default=None, init=False, repr=False, compare=False)  # refs()'s

    __hash__ = _cached_hash


Node = Union[Chars, Seq, Alt, Repeat, Bounded, Ref, Compiled, Graph]
EMPTY = Seq(())  # matches only the empty string
NOTHING = Alt(())  # matches nothing


# ---- code point sets --------------------------------------------------------------------------
def normalize(ranges: Iterable[tuple[int, int]]) -> Ranges:
    """Sorted, merged ranges with surrogates removed."""
    out: list[list[int]] = []
    for lo, hi in sorted(ranges):
        for a, b in _minus_surrogates(lo, hi):
            if out and a <= out[-1][1] + 1:
                out[-1][1] = max(out[-1][1], b)
            else:
                out.append([a, b])
    return tuple((a, b) for a, b in out)


def _minus_surrogates(lo: int, hi: int) -> list[tuple[int, int]]:
    s_lo, s_hi = SURROGATES
    if hi < s_lo or lo > s_hi:
        return [(lo, hi)] if lo <= hi else []
    return [r for r in ((lo, s_lo - 1), (s_hi + 1, hi)) if r[0] <= r[1]]


def complement(ranges: Ranges) -> Ranges:
    out, nxt = [], 0
    for lo, hi in ranges:
        if lo > nxt:
            out.append((nxt, lo - 1))
        nxt = hi + 1
    if nxt <= MAX_CODE_POINT:
        out.append((nxt, MAX_CODE_POINT))
    return normalize(out)


def intersect(a: Ranges, b: Ranges) -> Ranges:
    out, i, j = [], 0, 0
    while i < len(a) and j < len(b):
        lo, hi = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        if lo <= hi:
            out.append((lo, hi))
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return tuple(out)


# ---- constructors -----------------------------------------------------------------------------
def chars(ranges: Iterable[tuple[int, int]]) -> Node:
    r = normalize(ranges)
    return Chars(r) if r else NOTHING


def char_class(spec: str) -> Node:
    """A class from 'a-z0-9_'-style text (no escapes; a '-' at either end is literal)."""
    ranges, i = [], 0
    while i < len(spec):
        if i + 2 < len(spec) and spec[i + 1] == "-":
            ranges.append((ord(spec[i]), ord(spec[i + 2])))
            i += 3
        else:
            ranges.append((ord(spec[i]), ord(spec[i])))
            i += 1
    return chars(ranges)


@functools.lru_cache(maxsize=1 << 16)
def literal(text: str) -> Node:
    """One node per text (nodes are immutable): schemas spell the same keys and enum values again and
    again, and the identity memos below (refs, size) then hit."""
    return seq(*(_char(c) for c in text))


@functools.lru_cache(maxsize=4096)
def _char(c: str) -> Chars:
    return Chars(((ord(c), ord(c)),))


def seq(*items: Node) -> Node:
    flat: list[Node] = []
    for item in items:  # type() rather than isinstance: the schema compiler calls this ~10^5 times
        if type(item) is Seq:
            flat.extend(item.items)
        elif type(item) is Alt and not item.items:  # NOTHING
            return NOTHING
        else:
            flat.append(item)
    return flat[0] if len(flat) == 1 else Seq(tuple(flat))


def alt(*items: Node) -> Node:
    flat: dict[Node, None] = {}  # first occurrences, in order: a dict, as a list's `in` made an enum of n values n^2
    for item in items:
        for x in item.items if isinstance(item, Alt) else (item,):
            flat.setdefault(x)
    return next(iter(flat)) if len(flat) == 1 else Alt(tuple(flat))


def repeat(item: Node, lo: int, hi: int | None) -> Node:
    if hi == 0 or (type(item) is Seq and not item.items):
        return EMPTY
    if _is_nothing(item):
        return EMPTY if lo == 0 else NOTHING
    if lo == hi == 1:
        return item
    return Repeat(item, lo, hi)


def _is_nothing(node: Node) -> bool:  # `== NOTHING`, without the dataclass comparison's dispatch
    return type(node) is Alt and not node.items


def optional(item: Node) -> Node:
    return repeat(item, 0, 1)


# ---- properties -------------------------------------------------------------------------------
def nullable(node: Node) -> bool:
    """Whether `node` matches the empty string (a `Ref` counts as non-empty)."""
    if isinstance(node, Chars | Ref):
        return False
    if isinstance(node, Compiled):
        return bool(node.dfa.accept[node.dfa.start] >= 0)
    if isinstance(node, Seq):
        return all(nullable(x) for x in node.items)
    if isinstance(node, Alt):
        return any(nullable(x) for x in node.items)
    if isinstance(node, Repeat):
        return node.min == 0 or nullable(node.item)
    if isinstance(node, Graph):
        return bool(graph_closure(node, 0) & set(node.finals))
    return nullable(node.item)


def graph_closure(graph: Graph, state: int) -> set[int]:
    """The states reachable from `state` through edges that can read nothing."""
    seen, stack = {state}, [state]
    while stack:
        s = stack.pop()
        for src, node, dst in graph.edges:
            if src == s and dst not in seen and nullable(node):
                seen.add(dst)
                stack.append(dst)
    return seen


_NO_REFS: frozenset[str] = frozenset()


def children(node: Node) -> tuple[Node, ...]:
    """The nodes `node` is made of (none for a leaf: characters, a compiled DFA, a rule reference)."""
    if isinstance(node, Seq | Alt):
        return node.items
    if isinstance(node, Repeat | Bounded):
        return (node.item,)
    if isinstance(node, Graph):
        return tuple(n for _, n, _ in node.edges)
    return ()


def refs(node: Node) -> frozenset[str]:
    """The rule names `node` refers to. Kept on the node (its `_refs`): schemas share subtrees, and the
    grammar writer asks again at every level of a tree. On the node rather than in a memo by identity, which
    held every tree it had seen alive: 200k nodes after 300 schemas, and a full pass of the cyclic
    collector then took ~230 ms, inside whatever step it fell in."""
    if type(node) is Chars:  # most calls: a leaf, answered before the isinstance checks
        return _NO_REFS
    if isinstance(node, Ref):
        return frozenset((node.name,))
    if isinstance(node, Chars | Compiled):
        return _NO_REFS
    if node._refs is not None:
        return node._refs
    parts = [r for r in map(refs, children(node)) if r]  # most subtrees have none: share the empty set
    out = parts[0] if len(parts) == 1 else frozenset().union(*parts) if parts else _NO_REFS
    object.__setattr__(node, "_refs", out)
    return out


def size(node: Node) -> int:
    """About how many NFA states `node` builds into (repeats and shared subtrees are copies). Memoized
    on the node, as `refs` is: the schema compiler asks at every level of a tree."""
    if type(node) is Chars:  # most calls: a leaf, answered before the isinstance checks
        return 1
    if isinstance(node, Chars | Ref):
        return 1
    if isinstance(node, Compiled):
        return len(node.dfa.trans)
    if node._size >= 0:
        return node._size
    if isinstance(node, Seq | Alt):
        out = 1 + sum(map(size, node.items))
    elif isinstance(node, Repeat):
        out = 1 + size(node.item) * max(node.min + 1 if node.max is None else node.max, 1)
    elif isinstance(node, Bounded):
        out = size(node.item) * node.max_bytes
    else:
        out = node.num_states + sum(size(n) for _, n, _ in node.edges)
    object.__setattr__(node, "_size", out)
    return out
