"""JSON objects whose members take any order, each at most once, built as decoding reaches them.

Exactly, such an object is an automaton over the sets of members written: 2^n states for n members,
too many to build past a few members (json_objects builds it eagerly up to ANY_ORDER_MAX_PROPERTIES).
Past that, json_objects leaves the object in the schema's regex as a marker character (a control
character: JSON never writes one raw) and describes it (LazyObject). Here the schema's DFA is laid out
over all 256 bytes, and a state that reads a marker reads the object instead:
- a *hub* (the set W of members written, whether the brace is still to open) is a small DFA over the
  keys not yet written, the undeclared keys (anywhere: an undeclared member leads back to the hub of W)
  and, once every required member is written, the closing brace; the brace's final state leads where
  the marker led;
- a key's final state leads into its member's *value* (the colon and the value: a DFA built once per
  member, up front), whose final states lead on into the hub of W plus that member.
An undeclared value's containers nested past the inline depth are a marker too (json_objects.ANY_MARKER):
it reads a *level*, any JSON object or array whose values are scalars or the marker again, whose final
states lead where the marker led, so such a value nests as deep as a decode writes it.
Hubs and values are appended to the table the first time a walk reaches them (growing_dfa), so a decode
builds the n + 1 hubs and n values it visits; a value's states past its first few bytes are laid a stretch at a
time when a walk first reaches one (a mask walk from a key reads a few bytes into many values it never enters; a
bounded string's chain is laid as far as a decode reads). A value may
hold lazy objects of its own.
"""
from __future__ import annotations

import bisect
import heapq
import threading
from dataclasses import dataclass
from operator import methodcaller
from typing import Callable, Iterable

import numpy as np

from ...kernels.cpu import fsa as native_fsa
from ...kernels.cpu.c_library import address
from .growing_dfa import MAX_GROWN_STATES, GrowingDfa
from .jsonschema.json_objects import ANY_MARKER, ANY_MARKER_PATH, LazyObject
from .masks.native_trie import zeroed
from .masks.token_index import TokenIndex
from .masks.vocab import TokenVocab
from .regex import regex_ast as ra
from .regex.automaton import Dfa, compile_dfa
from .regex.fsa import row_ids, trim

# bytes a hub may start with after a member: whitespace, the comma, the closing brace
_AFTER_MEMBER = np.array([ord(c) for c in " \t\n\r,}"])
# rows reserved per table (4 bytes a column, at most 1 KB: 256 MB in all): an anonymous map, so the OS commits a
# 4 KB page only when a row is laid there (no huge pages: a value copy's rows not laid yet stay unbacked), and the
# table grows without copying up to this; past it (a cached table past MAX_GROWN_STATES still serving its requests) it
# doubles, copying. Growing by copies (and -1 fills) from 1,024 rows took most of a lazily built object's cold
# mask time on JSONSchemaBench (project-1.0.0-rc2's table numbers 168k rows)
_RESERVED_ROWS = 4 * MAX_GROWN_STATES
# a value's copy lays the states within this many bytes of its start at once, and the rest when a walk first
# reaches one of them: a mask walk from a hub reaches every key spelt whole by one token (`id":`, `type":`) and a
# few bytes into its value (`":{"`), so most copies of a large value (a nested object) are only ever read there
VALUE_HEAD_BYTES = 6
# ... and the rest a stretch at a time: a state first reached lays the states as far from the start as it, the
# longest token (a walk from it reads no farther) and this many bytes more (the decode's next few tokens, read
# without a walk stopping at an unbuilt row again). A bounded string is a chain of maxLength levels (Snowplow's
# 7,000 states): laid whole for each member set, it took 13-20 ms where a decode wrote ~15 characters (sp_47: 62 of
# its 92 ms of cold masks)
REST_AHEAD_BYTES = 16
# a build for a walk also builds the waiting states this many bytes past the ones it reached: the walk, asked
# again, would reach them next (a key's value's first byte, the hub after a value); their pieces are mostly laid
# already, so this lays few more rows and saves a quarter of the walks that stop at an unbuilt row (rc2: 976 ->
# 729); a further byte laid a few percent more rows for fewer saved walks
BUILD_AHEAD_BYTES = 1
# the objects' keys DFAs built with the table, nearest the root first, up to this many keys in all (the rest on first
# reach): each took 1-2 ms of a first mask (an object's undeclared keys are a string minus its declared names). On
# JSONSchemaBench's table sample, none / 32 / 64 / 256 keys: fresh masks 122 / 115 / 108 / 113 us, compile + first
# mask p90 195 / 193 / 205 / 223 ms (a schema of many objects builds keys it never reads), p50 ~22 ms throughout
EAGER_KEYS_MAX = 64
ANY_LEVEL = -1  # a marker's object index for ANY_MARKER: a level of any containers (ObjectDispatch._any)
# where a waiting state's row comes from: called with the dispatch (`target(dispatch)`), never bound to it. The
# dispatch keeps its targets (_pending, _rests): a bound method there made each dropped constraint a reference
# cycle, its tables freed only by the cyclic collector, in whichever thread's collection came next
Target = Callable[["ObjectDispatch"], int]


def _to_state(state: int) -> Target:
    return lambda _: state


class NotLazy(ValueError):
    """Where a lazy object starts, the schema's DFA reads something the object could start with too (an
    anyOf of two objects, say), or a member's value reads on where the next member starts: the schema
    compiles again with those objects (`paths`) in declared order."""

    def __init__(self, why: str, paths: set[str], complete: bool = True):
        """`complete`: `paths` names every such object (False: those found before the check stopped)."""
        super().__init__(f"{why} at {sorted(paths)}")
        self.paths = frozenset(paths)
        self.complete = complete


@dataclass(slots=True)
class _Part:
    """A piece's DFA over all 256 bytes, its marker bytes taken out, and where it read them."""
    trans: np.ndarray  # [S, 256] int32
    accept: np.ndarray  # [S] int32: the accepted pattern's index, or -1
    start: int
    markers: dict[int, tuple[int, int]]  # state -> (lazy object, or ANY_LEVEL; the state after it)
    classes: np.ndarray | None = None  # [S, K] the DFA over its byte classes, markers read (_part's): for searches
    layers: _Layers | None = None  # a value's (_split; None: laid whole): its states by distance from the start
    finals: np.ndarray | None = None  # a value's (_split): its final states
    byte_class: np.ndarray | None = None  # [256] its DFA's byte classes, each marker byte apart (None: every byte)


_NO_KEY = 1 << 40  # _least_skips' "no key ends here"


def _least_skips(trans: np.ndarray, own: np.ndarray) -> np.ndarray:
    """By state of a hub's DFA (`trans`, any columns): the fewest members skipped by a key or brace it can still
    end (`own`: a final state's own count, _NO_KEY elsewhere), found backwards from the finals, fewest first."""
    n = len(trans)
    sources, columns = np.nonzero(trans >= 0)
    edges = np.unique(trans[sources, columns].astype(np.int64) * n + sources)  # (target, source), by target
    before, first = edges % n, np.searchsorted(edges // n, np.arange(n + 1))
    least = own.copy()
    queue = [(int(v), q) for q, v in enumerate(own.tolist()) if v != _NO_KEY]
    heapq.heapify(queue)
    while queue:
        v, q = heapq.heappop(queue)
        if v > least[q]:
            continue
        for p in before[first[q]:first[q + 1]].tolist():
            if v < least[p]:
                least[p] = v
                heapq.heappush(queue, (v, p))
    return least


def _shifted(rows: np.ndarray, out: np.ndarray, offset: int, columns: np.ndarray | None = None) -> None:
    """`rows` [n, 256] (of those, the values at `columns` only: the table's columns) written to `out` with every
    live target moved by `offset` (dead, -1, stays dead)."""
    lib = native_fsa.library()
    if lib is not None and rows.dtype == out.dtype == np.int32 and rows.flags.c_contiguous and out.flags.c_contiguous:
        if columns is None:  # one pass (numpy's below: 5-7x as long)
            lib.rl_shift_rows(rows.size, address(rows), address(out), offset)
        else:
            lib.rl_shift_columns(len(rows), address(rows), rows.shape[1], address(columns), len(columns),
                                 address(out), offset)
        return
    if columns is not None:
        rows = rows[:, columns]
    # offset where live, 0 where dead, plus the row: two passes with no masked store (which took 2-4x as long
    # for a value's stretch of tens of rows)
    np.multiply(rows >= 0, offset, out=out, dtype=np.int32, casting="unsafe")
    np.add(out, rows, out=out)


def _shifted_at(rows: np.ndarray, which: np.ndarray, out: np.ndarray, offset: int, columns: np.ndarray) -> None:
    """`_shifted` of `rows[which]` alone (sorted distinct rows), each into its own row of `out`: in one native call
    (fsa.c's rl_shift_rows_at), else run by run as slices (a bounded string's stretch is a few runs of consecutive
    states, its levels: a fraction of gathering and scattering its rows one by one, 256 columns each)."""
    lib = native_fsa.library()
    if lib is not None and rows.dtype == out.dtype == np.int32 and rows.flags.c_contiguous and out.flags.c_contiguous:
        which = np.ascontiguousarray(which, np.int64)
        lib.rl_shift_rows_at(len(which), address(which), address(rows), rows.shape[1], address(columns), len(columns),
                             address(out), offset)
        return
    for first, end in _runs(which):
        _shifted(rows[first:end], out[first:end], offset, columns)


def _runs(states: np.ndarray) -> list[tuple[int, int]]:
    """Sorted distinct `states` as runs of consecutive numbers, [first, end) each, in order."""
    if not len(states):
        return []
    last = np.flatnonzero(np.diff(states) != 1)  # each run's last place but the final run's
    firsts = np.concatenate((states[:1], states[last + 1]))
    ends = np.concatenate((states[last], states[-1:])) + 1
    return list(zip(firsts.tolist(), ends.tolist()))


class _Layers:
    """A value's states by their distance from its start (breadth-first, in bytes), found once and shared by its
    copies: a copy lays those within VALUE_HEAD_BYTES first, the others a stretch at a time on first reach
    (_lay_rest)."""

    def __init__(self, classes: np.ndarray, start: int):
        # a marker reads on to the state after its object: a byte farther, for this search
        self.dist, self.order = _distances(np.ascontiguousarray(classes, np.int32), start)
        self.farthest = int(self.dist[self.order[-1]])
        self._cuts = np.searchsorted(self.dist[self.order], np.arange(self.farthest + 2))  # where each distance starts

    def within(self, near: int, far: int) -> np.ndarray:
        """The states at distances `near` to `far`, sorted."""
        far = min(far, self.farthest)
        if near > far:
            return np.zeros(0, np.int64)
        return np.sort(self.order[self._cuts[near]:self._cuts[far + 1]])


def _distances(classes: np.ndarray, start: int) -> tuple[np.ndarray, np.ndarray]:
    """Each state's breadth-first distance from `start` (-1: not reached), and the states reached in that order: in
    C (fsa.c's rl_distances: a bounded string of 7,000 states in ~0.1 ms), else a level at a time."""
    n, k = classes.shape
    lib = native_fsa.library()
    if lib is not None:
        dist, order = np.empty(n, np.int64), np.empty(n, np.int32)
        reached = lib.rl_distances(n, k, address(classes), start, address(dist), address(order))
        return dist, order[:reached].astype(np.int64)
    dist = np.full(n, -1, np.int64)
    dist[start] = 0
    levels, level = [np.array([start])], np.array([start])
    while len(level):
        nxt = classes[level].ravel()
        nxt = np.unique(nxt[nxt >= 0])
        level = nxt[dist[nxt] < 0]
        dist[level] = len(levels)
        levels.append(level)
    return dist, np.concatenate(levels)


def _split(part: _Part) -> _Part:
    """`part` with its final states and its layers (none where every state is within VALUE_HEAD_BYTES: laid
    whole), its rows shared (numbered as they are: a copy lays each stretch where it falls)."""
    assert part.classes is not None, "a value's part is _part's"
    layers = _Layers(part.classes, part.start)
    whole = layers.farthest <= VALUE_HEAD_BYTES and len(layers.order) == len(part.trans)
    return _Part(part.trans, part.accept, part.start, part.markers, part.classes, None if whole else layers,
                 np.flatnonzero(part.accept >= 0), part.byte_class)


def _part(patterns: list[ra.Node], objects: tuple[LazyObject, ...]) -> _Part:
    """Raises NotLazy naming every object that starts where another or a `{` does (all of them at
    once: each round of NotLazy recompiles the schema)."""
    dfa = compile_dfa(patterns)
    classes = np.asarray(dfa.byte_class, np.int64)
    # the markers' clashes read off the DFA's own columns (one per byte class) before the rows are spread over 256
    # bytes: a schema's hundreds of parts are checked for all its objects' markers, and a clash ends the part
    marker_bytes = [ord(marker) for marker in (*(obj.marker for obj in objects), ANY_MARKER)]
    kinds = [*range(len(objects)), ANY_LEVEL]
    path = [*(obj.path for obj in objects), ANY_MARKER_PATH]  # by index: ANY_LEVEL is the last
    leads = dfa.trans[:, classes[marker_bytes]]  # [states, markers]: where each marker leads
    opens_object = dfa.trans[:, classes[ord("{")]] >= 0  # a marker's state must not read what its object or level starts with
    opens_container = opens_object | (dfa.trans[:, classes[ord("[")]] >= 0)
    markers: dict[int, tuple[int, int]] = {}
    clashes: set[str] = set()
    marker_at, state_at = np.nonzero(leads.T >= 0)  # marker by marker, each one's states in order
    for i, s in zip(marker_at.tolist(), state_at.tolist()):
        k = kinds[i]
        opens = opens_container if k == ANY_LEVEL else opens_object
        if s in markers or opens[s]:
            clashes |= {path[i]} | ({path[markers[s][0]]} if s in markers else set())
        else:
            markers[s] = (k, int(leads[s, i]))
    if clashes:
        raise NotLazy("objects start at one place", clashes)
    # in row order (rows are laid as slices: _shifted), which np.take gives 4x faster than a fancy index (column order)
    trans = np.take(dfa.trans, classes, axis=1).astype(np.int32, copy=False)
    trans[:, marker_bytes] = -1  # a marker leads into its object's hub (markers), not a row of its own
    # the marker columns were emptied: each marker byte a class apart (most are already: JSON reads no control
    # byte raw; refined only where one is not, since a schema has a part per member and np.unique costs ~0.1 ms)
    byte_class = classes.astype(np.int32)
    sizes = np.bincount(byte_class, minlength=int(byte_class.max()) + 1)
    if (sizes[byte_class[marker_bytes]] > 1).any():
        apart = np.zeros(256, np.int32)
        apart[marker_bytes] = np.arange(1, len(marker_bytes) + 1)
        byte_class = common_classes(byte_class, apart)
    return _Part(trans, dfa.accept, dfa.start, markers, dfa.trans, byte_class=byte_class)


def common_classes(*classes: np.ndarray) -> np.ndarray:
    """The coarsest partition of the 256 bytes that refines each of `classes` ([256] class ids each), as [256]
    int32 class ids numbered by their first byte."""
    # each distinct partition once (a schema's parts share a few), as the columns of one row per byte
    distinct = {np.asarray(one, np.int64).tobytes(): one for one in classes}
    _, first, inverse = np.unique(row_ids(np.stack(list(distinct.values()), axis=1)), return_index=True,
                                  return_inverse=True)
    order = np.argsort(np.argsort(first))  # classes numbered by their first byte: byte 0's class is 0
    return order[inverse.ravel()].astype(np.int32)


def _first_bytes(byte_class: np.ndarray) -> np.ndarray:
    """The first byte of each class of `byte_class` (classes numbered by their first byte)."""
    return np.unique(byte_class, return_index=True)[1].astype(np.int64)


def _reserved(rows: int, width: int) -> np.ndarray:
    """[rows, width] int32, zero, from an anonymous map where large (native_trie.zeroed): backed only where written."""
    return zeroed(rows * width, np.int32).reshape(rows, width)


def _doubled(rows: np.ndarray, used: int) -> np.ndarray:
    """`rows` in a buffer twice as long, its first `used` rows copied (the rest are never read before laid)."""
    out = _reserved(2 * len(rows), rows.shape[1]) if rows.ndim == 2 else np.zeros(2 * len(rows), rows.dtype)
    out[:used] = rows[:used]
    return out


class ObjectDispatch(GrowingDfa):
    """A JSON schema's DFA whose lazy objects (json_objects.LazyObject) are built on first reach."""

    def __init__(self, root: ra.Node, objects: tuple[LazyObject, ...], vocab: TokenVocab,
                 any_level: ra.Node | None = None, first_clash: bool = False):
        """`first_clash`: raise NotLazy at the first clash of an object (not of ANY_MARKER's level alone), naming
        what was found so far (`complete` False), instead of every clash: the compiler, whose first answer to
        such a clash is a grammar that needs none of the paths, asks this way (two of JSONSchemaBench's
        slowest compiles spent 350-450 ms building the parts past their first clash)."""
        self.objects, self.vocab = objects, vocab
        self._longest = int(vocab.lengths.max(initial=0))  # bytes: how far a walk reads (_lay_rest)
        self._lock = threading.Lock()
        # each member's value DFA, up front: a schema they do not fit is refused (or recompiled) now, naming
        # every object that does not fit, the root's too, in one NotLazy (a round recompiles the schema)
        clashes: set[str] = set()
        why = "objects start where others do, or a member's value reads on where the next member starts"

        def clash(paths: Iterable[str]) -> None:
            clashes.update(paths)
            if first_clash and clashes - {ANY_MARKER_PATH}:
                raise NotLazy(why, clashes, complete=False)

        def checked(patterns: list[ra.Node]) -> _Part | None:
            try:
                return _part(patterns, objects)
            except NotLazy as e:
                clash(e.paths)
                return None

        # a value pattern's part once: members share most (a schema's string fields alike: JSONSchemaBench's tables
        # hold 2,307 values of 770 patterns), and a part is its DFA over all 256 bytes (a bounded string's, megabytes)
        by_pattern: dict[ra.Node, _Part | None] = {}

        def value_part(pattern: ra.Node) -> _Part | None:
            if pattern not in by_pattern:
                by_pattern[pattern] = checked([pattern])
            return by_pattern[pattern]

        values = [[value_part(v) for v in (*o.values, *o.extra_values)] for o in objects]
        for obj, parts in zip(objects, values):
            for part in filter(None, parts):
                finals = part.accept >= 0
                if (part.trans[finals][:, _AFTER_MEMBER] >= 0).any() or any(finals[s] for s in part.markers):
                    clash({obj.path})  # a member's value reads on where the next member starts
        root_part = checked([root])
        # ANY_MARKER's level, laid where a decode reaches one (`_any`, one copy per place it leads back to)
        self._any_part = checked([any_level]) if any_level is not None else None
        self._any_starts: dict[int, int] = {}
        if clashes or root_part is None:
            raise NotLazy(why, clashes)
        self._values = [list(filter(None, parts)) for parts in values]  # every part built: none dropped
        self._split: dict[int, _Part] = {}  # a value part's id -> its split (_split), on its first copy (parts are shared)
        # every value copy's offset (sorted: laid in order) and part, and those whose rest is not all laid yet: (part,
        # where its finals lead, the distance from the start up to which its states are laid)
        self._copy_offsets: list[int] = []
        self._copies: dict[int, _Part] = {}
        self._rests: dict[int, tuple[_Part, Target, int]] = {}
        self._keys_parts: dict[tuple[int, bool], _Part] = {}  # (object, opening) -> every key's DFA
        self._hub_parts: dict[tuple[int, int, bool], _Part] = {}  # (object, written, opening) -> its DFA
        self._hubs: dict[tuple[int, int, bool, int], int] = {}  # (object, written, opening, exit) -> start
        self._value_starts: dict[tuple[int, int, int, int], int] = {}  # (object, member, written, exit) -> start
        # each hub's first row, and its DFA with the members each final state's key skips (declared ones still
        # missing before it; an undeclared key, all those still missing; the brace, none): warm_edges' order, the
        # schema's. A key's states before its end take the fewest of the keys they can still end (`_least_skips`,
        # found when warming first asks)
        self._hub_offsets: list[int] = []
        self._hub_keys: list[tuple[np.ndarray, np.ndarray]] = []
        self._hub_least: dict[int, np.ndarray] = {}
        # an unbuilt state's own row (over all 256 bytes) and accept, the state whose row it takes in, and whether
        # its accept too
        self._pending: dict[int, tuple[np.ndarray, int, Target, bool]] = {}
        # the keys DFAs of the objects nearest the root, now: every decode that enters an object reads both (its
        # first key, then the others), and each took a millisecond or more of a first mask
        keys = 0
        for k in sorted(range(len(objects)), key=lambda k: objects[k].path.count("/")):
            keys += len(objects[k].keys) + len(objects[k].extra_keys)
            if keys > EAGER_KEYS_MAX:
                break
            self._keys_part(k, True)
            self._keys_part(k, False)
        # the table's columns: the bytes every piece known now reads alike (a row is 4 bytes a column: a value's
        # stretch of a bounded string, 1,300 rows, was 1.3 MB of fresh pages over 256 columns); a piece built later
        # that tells apart bytes of one column refines them (_admit: rare, the table is copied)
        known = [root_part, *(p for parts in self._values for p in parts), *self._keys_parts.values(),
                 *([self._any_part] if self._any_part is not None else [])]
        self._byte_class = common_classes(*(p.byte_class for p in known if p.byte_class is not None))
        self._admitted: dict[int, np.ndarray] = {}  # byte classes the columns refine (_admit), by id
        self._columns = _first_bytes(self._byte_class)  # a byte of each column, read from a piece's 256
        self._trans = _reserved(_RESERVED_ROWS, len(self._columns))  # rows past _size are never read
        self._accept = np.empty(_RESERVED_ROWS, np.int32)
        self._unbuilt = np.zeros(_RESERVED_ROWS, bool)
        self._size = 0
        start = self._lay(root_part, keep_accept=True)
        self._publish(start)
        # the index reads the reserved buffers themselves, not the published views: rows past _size are reached
        # from no row, and a row's unbuilt mark clears only once the row is final (_lay_rows, _build_one), so
        # the index (its native walker) stays valid as the table grows; only a doubling or a refinement of the
        # columns moves the buffers
        self._index = TokenIndex(self._table_dfa(start), vocab, unbuilt=self._unbuilt)

    # ---- laying out pieces ------------------------------------------------------------------------
    def _lay(self, part: _Part, keep_accept: bool = False, finals_to: Target | None = None) -> int:
        """Appends `part`'s rows; its markers lead into their objects' opening hubs and (with `finals_to`)
        its final states into that state's row; returns where its start state went. A value's rows past its
        head are numbered now but laid (`_lay_rows`, a stretch at a time) when a walk first reaches one: unbuilt till
        then."""
        offset, count = self._size, len(part.trans)
        self._admit(part)
        while offset + count > len(self._trans):
            self._trans, self._accept, self._unbuilt = (_doubled(a, offset) for a in (self._trans, self._accept,
                                                                                      self._unbuilt))
        self._accept[offset:offset + count] = np.where(part.accept >= 0, 0, -1) if keep_accept else -1
        self._size += count
        if finals_to is not None:  # its part first: a reader finding the offset finds the part
            self._copies[offset] = part
            self._copy_offsets.append(offset)
        if part.layers is not None and finals_to is not None:
            self._unbuilt[offset:offset + count] = True  # unread: a walk stops before an unbuilt row
            self._lay_rows(part, offset, part.layers.within(0, VALUE_HEAD_BYTES), finals_to)
            self._rests[offset] = (part, finals_to, VALUE_HEAD_BYTES)
        else:
            self._lay_rows(part, offset, None, finals_to)
        return offset + part.start

    def _admit(self, part: _Part) -> None:
        """Refines the table's columns where `part` tells apart bytes of one column (a keys DFA built after the
        table, with letters no piece before it read apart): the laid rows are copied over the finer columns, into
        new buffers that the index moves to, as on a doubling."""
        piece = part.byte_class
        if piece is None or id(piece) in self._admitted:
            return
        if np.array_equal(piece, piece[self._columns][self._byte_class]):  # each byte reads as its column's first
            self._admitted[id(piece)] = piece  # for good: columns only grow finer (kept, so its id stays its own)
            return
        byte_class = common_classes(self._byte_class, piece)
        columns = _first_bytes(byte_class)
        wider = self._byte_class[columns]  # each new column's old one
        trans = _reserved(len(self._trans), len(columns))
        trans[:self._size] = self._trans[:self._size][:, wider]  # the waiting rows are kept over all bytes
        # the marks and accepts copied too, as a doubling does: a walk still reading the old buffers must go on
        # seeing a waiting row unbuilt once it is built in the new ones
        self._accept, self._unbuilt = self._accept.copy(), self._unbuilt.copy()
        self._trans, self._byte_class, self._columns = trans, byte_class, columns

    def _table_dfa(self, start: int, size: int | None = None) -> Dfa:
        """The table's first `size` rows (None: its whole reserved buffers) as a Dfa over its columns."""
        trans, accept = (self._trans, self._accept) if size is None else (self._trans[:size], self._accept[:size])
        return Dfa(trans, accept, self._byte_class, start=start)

    def _lay_rows(self, part: _Part, offset: int, which: np.ndarray | None,
                  finals_to: Target | None) -> None:
        """Writes `part`'s rows `which` (None: all) at `offset` on, their markers and finals deferred; the others'
        unbuilt marks clear last (a walk reading the marks meanwhile sees each row unbuilt or final)."""
        count = len(part.trans)
        columns = self._columns
        if which is None:
            _shifted(part.trans, self._trans[offset:offset + count], offset, columns)
            built = np.ones(count, bool)
        else:
            _shifted_at(part.trans, which, self._trans[offset:offset + count], offset, columns)
            built = np.zeros(count, bool)
            built[which] = True
        marked = [(s, k, after) for s, (k, after) in part.markers.items() if built[s]]
        if marked:
            self._defer(offset + np.array([s for s, _, _ in marked], np.int64),
                        [methodcaller("_any", offset + after) if k == ANY_LEVEL else
                         methodcaller("_hub", k, 0, True, offset + after) for _, k, after in marked], False)
            built[[s for s, _, _ in marked]] = False
        if finals_to is not None:
            finals = np.flatnonzero((part.accept >= 0) & built)
            self._defer(offset + finals, finals_to, False)
            built[finals] = False
        self._unbuilt[offset:offset + count][built] = False

    def _copy_of(self, state: int) -> int | None:
        """The offset of the value copy holding `state` (None: none, or `state` waits on another row)."""
        at = bisect.bisect_right(self._copy_offsets, state) - 1
        if at < 0 or state in self._pending:
            return None
        offset = self._copy_offsets[at]
        return offset if state < offset + len(self._copies[offset].trans) else None

    def _rest_of(self, state: int) -> tuple[int, _Part, Target, int] | None:
        """The value copy holding `state` whose rest a walk from `state` reads into before it is laid: (its offset,
        part, where its finals lead, the distance laid to); None where there is none, or the walk reads laid rows
        only (a state waiting on another row reads its own row, laid already)."""
        offset = self._copy_of(state) if self._rests else None
        if offset is None:
            return None
        hit = self._rests.get(offset)  # one read: a build in another thread may finish laying it meanwhile
        if hit is None:
            return None
        part, finals_to, laid = hit
        assert part.layers is not None
        dist = int(part.layers.dist[state - offset])
        assert dist >= 0, "walks reach only states the value's start reaches"
        return None if dist + self._longest <= laid else (offset, part, finals_to, laid)

    def _lay_rest(self, state: int) -> None:
        """Lays the next stretch of the value copy holding `state` if a walk from `state` would read past what is
        laid: the states up to the longest token and REST_AHEAD_BYTES farther from the start than `state`. A build
        lays it for an unbuilt state only (a walk from a hub reads a few bytes into many values it never enters,
        whose heads are laid); a decode's own state, before its walk (_before_walk), when near the stretch's end."""
        rest = self._rest_of(state)
        if rest is None:
            return
        offset, part, finals_to, laid = rest
        layers = part.layers
        assert layers is not None
        reach = int(layers.dist[state - offset]) + self._longest + REST_AHEAD_BYTES
        stretch = layers.within(laid + 1, reach)
        if len(stretch):
            self._lay_rows(part, offset, stretch, finals_to)
        if layers.farthest <= reach:  # marked laid once laid: a build that raised leaves it to lay again
            del self._rests[offset]
        else:
            self._rests[offset] = (part, finals_to, reach)

    def _before_walk(self, state: int) -> None:
        """A decode's state inside a value copy lays the copy's next stretch, and builds the hub after the value (its
        finals' target, which the decode reaches in the end), before its walk: that walk would otherwise stop at an
        unbuilt row, voided, and walk again (~1 ms of a bounded string's first mask, whose final is a byte away)."""
        offset = self._copy_of(state)
        if offset is None:
            return
        finals = self._copies[offset].finals
        assert finals is not None, "a value's part is _split's"
        waiting = [final for final in (offset + finals).tolist() if final in self._pending]
        if not waiting and self._rest_of(state) is None:
            return
        with self._lock:
            try:
                self._lay_rest(state)
                self._build_many(waiting)
            finally:
                self._publish(self.dfa.start)

    def _defer(self, states: np.ndarray, targets: Target | list[Target],
               take_accept: bool) -> None:
        """Each of `states` reads its own row and, once built, the row of its target's (`targets`: one for all, or one
        each; and its accept, if asked). The rows are kept over all 256 bytes (building a target may refine the
        table's columns: _admit), gathered at once (a number's dozen final states, a hub's keys)."""
        if not len(states):
            return
        rows, accepts = self._trans[states][:, self._byte_class], self._accept[states].tolist()
        each = targets if isinstance(targets, list) else [targets] * len(states)
        for state, row, accept, target in zip(states.tolist(), rows, accepts, each):
            self._pending[state] = (row, accept, target, take_accept)
        self._trans[states] = -1  # unbuilt rows read nothing: a forced-bytes walk stops there
        self._accept[states] = -1
        self._unbuilt[states] = True

    def _hub(self, k: int, written: int, opening: bool, exit: int) -> int:
        key = (k, written, opening, exit)
        if key not in self._hubs:
            obj, part = self.objects[k], self._hub_part(k, written, opening)
            start = self._lay(part)
            offset = start - part.start
            declared = len(obj.keys)
            finals = np.flatnonzero(part.accept >= 0)
            targets: list[Target] = []
            own = np.full(len(part.trans), _NO_KEY, np.int64)
            for s, label in zip(finals.tolist(), part.accept[finals].tolist()):
                if label == 0:  # the closing brace: on where the marker led
                    own[s] = 0
                    targets.append(_to_state(exit))
                else:  # a key: into its member's value
                    member = label - 1
                    now = written | 1 << member if member < declared else written
                    targets.append(methodcaller("_value", k, member, now, exit))
                    own[s] = (~written & ((1 << min(member, declared)) - 1)).bit_count()
            self._defer(offset + finals, targets, take_accept=True)
            self._hub_offsets.append(offset)  # laid in order: sorted
            self._hub_keys.append((part.trans, own))
            self._hubs[key] = start
        return self._hubs[key]

    def _any(self, exit: int) -> int:
        """A level of any containers whose final states (the closing bracket) lead into `exit`'s row, as the
        brace of a hub does."""
        if exit not in self._any_starts:
            part = self._any_part
            assert part is not None, "a table reads ANY_MARKER only where the schema gave its level"
            start = self._lay(part)
            offset = start - part.start
            self._defer(offset + np.flatnonzero(part.accept >= 0), _to_state(exit), take_accept=True)
            self._any_starts[exit] = start
        return self._any_starts[exit]

    def _hub_part(self, k: int, written: int, opening: bool) -> _Part:
        """The hub's DFA: the keys DFA without the keys written, nor the brace while a required member is
        missing, trimmed so that every state left can still end a key."""
        key = (k, written, opening)
        if key not in self._hub_parts:
            obj, keys = self.objects[k], self._keys_part(k, opening)
            member = keys.accept - 1  # -1: the closing brace, -2: not final
            declared = (member >= 0) & (member < len(obj.keys))
            was_written = np.array([written >> m & 1 == 1 for m in range(len(obj.keys))] + [False], bool)
            cut = declared & was_written[np.where(declared, member, -1)]  # by state: a written key's end
            if written & obj.required != obj.required:
                cut |= member == -1
            # no markers read: the DFA over its byte classes is the same automaton, narrower
            trans, accept = trim(keys.trans, np.where(cut, -1, keys.accept), keys.classes if not keys.markers else None)
            self._hub_parts[key] = _Part(np.ascontiguousarray(trans, np.int32), accept, 0, {},
                                         byte_class=keys.byte_class)
        return self._hub_parts[key]

    def _keys_part(self, k: int, opening: bool) -> _Part:
        """Every hub's DFA: pattern 0 the closing brace, 1 + i member i's key (declared, then undeclared);
        built once per object and brace."""
        key = (k, opening)
        if key not in self._keys_parts:
            obj = self.objects[k]
            ws = obj.ws
            head = ra.seq(ra.literal("{"), ws) if opening else ra.seq(ws, ra.literal(","), ws)
            close = ra.seq(ra.literal("{"), ws, ws, ra.literal("}")) if opening else ra.seq(ws, ra.literal("}"))
            part = _part([close, *(ra.seq(head, key) for key in (*obj.keys, *obj.extra_keys))], ())
            assert part.start == 0, "a trimmed hub keeps its start as state 0"
            self._keys_parts[key] = part
        return self._keys_parts[key]

    def _value(self, k: int, member: int, written: int, exit: int) -> int:
        key = (k, member, written, exit)
        if key not in self._value_starts:
            part = self._values[k][member]
            if id(part) not in self._split:
                self._split[id(part)] = _split(part)
            self._value_starts[key] = self._lay(self._split[id(part)],
                                                finals_to=methodcaller("_hub", k, written, False, exit))
        return self._value_starts[key]

    def warm_edges(self, state: int) -> list[tuple[int, int, bool]]:
        """The states one byte on from `state`, each with the members its key skips (warming.py's order): at a
        key's end, its own; before it, the fewest of the keys it can still end (`h` of `"height"` skips `base`, as
        `"height"` does, where `b` skips none)."""
        return [(t, self._skipped(t), rare) for t, _, rare in super().warm_edges(state)]

    def _skipped(self, state: int) -> int:
        i = bisect.bisect_right(self._hub_offsets, state) - 1
        if i < 0 or (q := state - self._hub_offsets[i]) >= len(self._hub_keys[i][0]):
            return 0  # not a hub's (a value's)
        own = self._hub_keys[i][1]
        if own[q] != _NO_KEY:  # a key's end: its own
            return int(own[q])
        least = self._hub_least.get(i)
        if least is None:
            least = self._hub_least[i] = _least_skips(*self._hub_keys[i])
        skipped = int(least[q])
        return 0 if skipped == _NO_KEY else skipped

    # ---- building on first reach ------------------------------------------------------------------
    def _build(self, states: int | list[int] | np.ndarray) -> None:
        with self._lock:
            frontier = np.atleast_1d(np.asarray(states, np.int64))
            try:
                self._build_many(frontier.tolist())
                for _ in range(BUILD_AHEAD_BYTES):
                    after = np.unique(self._trans[frontier])
                    after = after[after >= 0]
                    self._build_many([state for state in after.tolist() if state in self._pending])
                    frontier = after[~self._unbuilt[after]]
            finally:  # the rows built before a build that raised (a piece too large) are final: published too
                self._publish(self.dfa.start)

    def _publish(self, start: int) -> None:
        """The table's first _size rows as `dfa` and `unbuilt` (views of the reserved buffers), in this order: a
        reader that sees the new table also sees its marks."""
        size = self._size
        self.unbuilt = self._unbuilt[:size]
        self.dfa = self._table_dfa(start, size)

    @property
    def index(self) -> TokenIndex:  # type: ignore[override]  # the reserved buffers' index, moved with them
        index = self._index
        if index.dfa.trans is not self._trans:  # moved: the masks kept stay true (built rows never change)
            index = self._index = index.grown(self._table_dfa(self.dfa.start), self._unbuilt)
        return index

    def _build_many(self, states: list[int]) -> None:
        """Builds each of `states` (a waiting row merged with its target's, once the target is built; an unbuilt one
        laid); those waiting on one target (a value copy's final states, all leading into the hub after it: a number
        has a dozen) are merged at once."""
        by_target: dict[tuple[int, bool], list[int]] = {}
        for state in states:
            if self._unbuilt[state]:
                self._lay_rest(state)
            pending = self._pending.get(state)
            if pending is not None:
                by_target.setdefault((id(pending[2]), pending[3]), []).append(state)
        for group in by_target.values():
            group = [state for state in group if state in self._pending]  # an earlier group's build may build one
            if not group:
                continue
            waits = [self._pending.pop(state) for state in group]
            try:
                other = waits[0][2](self)
                self._build_one(other)
            except BaseException:  # a piece too large (ConstraintTooLarge): the states wait as before, not unbuilt
                self._pending.update(zip(group, waits))
                raise
            rows, theirs = np.stack([every_byte for every_byte, _, _, _ in waits])[:, self._columns], self._trans[other]
            assert not ((rows >= 0) & (theirs >= 0)).any(), "a lazy object's pieces read apart (checked up front)"
            at = np.array(group, np.int64)
            self._trans[at] = np.where(rows >= 0, rows, theirs)
            self._accept[at] = self._accept[other] if waits[0][3] else [accept for _, accept, _, _ in waits]
            self._unbuilt[at] = False

    def _build_one(self, state: int) -> None:
        self._build_many([state])
