"""Suffix walks through lexers no decode has reached yet, read from their NFA instead of built.

A grammar state's mask asks what follows each token that ends a lexeme part-way: the token's remaining
bytes are walked through the next lexer (constraint._suffix_walk). Where that lexer is one the decode has not
reached (the comma after an object's last member, then the keys still allowed after it), building it (subset
construction, minimization, UTF-8 expansion: 2-40 ms) to read a handful of tokens' few bytes was most of such
a mask's cost. A probe builds the lexer's Thompson NFA only and follows the rows' bytes through it, keeping the
subsets it meets (a lazy DFA). Its answers are the built lexer's: a subset is alive exactly when one of its
states can still reach acceptance (the built DFA is trimmed), its label is its accepting states' (the lowest,
or all of them with readings), and a character of several bytes lives as long as some well-formed completion
of its bytes so far lies in a class the subset reads (the built DFA's UTF-8 decoders read exactly those).
A terminal given as a compiled DFA (`ra.Compiled`: a JSON string's pattern within length bounds, a number's
multipleOf) is not copied into the NFA (that copy, state by state in Python, was most of a probe's cost): the
probe walks the DFA in place, its states standing as probe states of their own (`_Embedded`).

A probe is made of one piece per terminal (`ProbePiece`: the terminal's NFA over its own alphabet, walked a subset at a
time), kept by the grammar across its probes: a lexer a decode meets is most often the keys still allowed after one
more member, whose terminals the probe before it held. Built whole per lexer, a probe's NFA, alphabet and coreachable
states were ~0.1-1.5 ms each, a third of the fresh masks of the grammar schemas that take longest (Kubernetes
kb_684's 16 probes: 12 ms). The patterns' subsets are apart in the lexer's NFA (their start's moves neither read nor
accept), so a probe's subset is its pieces' subsets side by side, and a character lies in a class of each piece whose
sets hold it: the answers are the whole NFA's. A terminal that is one fixed string (an object's key, a punctuation
mark: most of a schema's) is a `LiteralPiece`, its subset the one position reached, with no NFA built at all: its
pieces were ~0.1 ms each, 8.7 of Kubernetes kb_684's 27 ms of fresh masks.
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from ..masks.vocab import TokenVocab
from ..regex import regex_ast as ra
from ..regex.alphabet import CharDfa, alphabet_of, owning_classes
from ..regex.automaton import char_sets, thompson
from ..regex.fsa import Nfa, reach

Subset = frozenset[int]
Subsets = tuple[tuple[int, Subset], ...]  # a probe's state: (piece, its subset) for each piece alive, in order
Suffixes = tuple[np.ndarray, list[tuple[tuple[str, ...], np.ndarray, np.ndarray]]]  # constraint._suffix_walk's
_VALID = {2: ((0x80, 0x7FF),), 3: ((0x800, 0xD7FF), (0xE000, 0xFFFF)), 4: ((0x10000, ra.MAX_CODE_POINT),)}


@dataclass(slots=True)
class _Embedded:
    """A compiled DFA the probe walks in place: its state q is probe state base + q; acceptance leads on to the
    NFA's state `end` (as the copy's accepting states' empty moves did)."""

    base: int
    end: int
    trans: np.ndarray  # the DFA's
    accept: np.ndarray
    of_class: list[int]  # by probe class: the DFA's class it lies in (-1: none)
    kept: np.ndarray  # by DFA state: whether the probe keeps it in a subset (it reads, and `end` is coreachable)


class _EmptyMoves:
    """The probe's empty moves, by state: the NFA's, an embedded DFA's entry into its start, and its accepting
    states' out to its end (indexable as `fsa.reach` reads an NFA's)."""

    def __init__(self, eps: list[list[int]], entries: dict[int, int], parts: list[_Embedded]):
        self._eps, self._entries, self.parts = eps, entries, parts
        self._bases = [part.base for part in parts]
        self._size = len(eps)

    def part(self, q: int) -> _Embedded:
        return self.parts[bisect.bisect_right(self._bases, q) - 1]

    def __getitem__(self, q: int) -> list[int] | tuple[int, ...]:
        if q < self._size:
            entry = self._entries.get(q)
            return self._eps[q] if entry is None else (entry,)
        part = self.part(q)
        return (part.end,) if part.accept[q - part.base] >= 0 else ()


class LexerProbe:
    """The lexer of `nodes` (named `names`, in preference order) as an NFA walked a byte at a time: a piece per
    terminal (`pieces`: the grammar's, kept across its probes by terminal tree), each stepped alone."""

    def __init__(self, nodes: list[ra.Node], names: list[str], readings: bool,
                 pieces: dict[ra.Node, Piece] | None = None):
        pieces = {} if pieces is None else pieces
        for node in nodes:
            if node not in pieces:  # stored once built whole (a deadline inside leaves nothing half built)
                pieces[node] = probe_piece(node)
        self._pieces = [pieces[node] for node in nodes]
        self._names, self._readings = names, readings
        self.walked = 0  # rows walked so far
        self._steps: dict[tuple[Subsets, int], Subsets] = {}
        self._start: Subsets = tuple((i, piece.start) for i, piece in enumerate(self._pieces) if piece.start)

    def suffixes(self, vocab: TokenVocab, rows: np.ndarray, p: int | np.ndarray) -> Suffixes:
        """`rows` (vocabulary rows) walked from the lexer's start from byte p (one for all, or per row): those
        alive at their end, and those that end a lexeme part-way, by the terminals it reads as (sorted), with
        where; the rest die."""
        self.walked += len(rows)
        starts = np.broadcast_to(np.asarray(p, np.int64), rows.shape).tolist()
        ok: list[int] = []
        ended: dict[tuple[str, ...], tuple[list[int], list[int]]] = {}
        for r, at in zip(rows.tolist(), starts):
            data = vocab.matrix[r, :vocab.lengths[r]].tobytes()
            stop, names = self._walk(data, at)
            if stop < 0:
                ok.append(r)
            elif names is not None:
                ended.setdefault(names, ([], []))
                ended[names][0].append(r)
                ended[names][1].append(stop)
        return (np.array(ok, np.int64), [(names, np.array(rs, np.int64), np.array(pos, np.int64))
                                         for names, (rs, pos) in sorted(ended.items())])

    def _walk(self, data: bytes, i: int) -> tuple[int, tuple[str, ...] | None]:
        """(-1, None) if `data[i:]` reads alive; else where it dies and the terminals the lexeme before reads as
        (None: incomplete there, or died inside a character)."""
        state, first, n = self._start, i, len(data)
        while i < n:
            b = data[i]
            if b < 0x80:
                nxt = self._step(state, b)
                if not nxt:
                    return i, self._label(state) if i > first else None
                state, i = nxt, i + 1
                continue
            width = 2 if 0xC2 <= b <= 0xDF else 3 if 0xE0 <= b <= 0xEF else 4 if 0xF0 <= b <= 0xF4 else 0
            code = b & (0x3F >> (width - 1)) if width else 0
            k = 0
            while True:  # bytes of the character read so far: i .. i + k
                if not width or not any(self._pieces[j].reads(sub, code, width, width - 1 - k) for j, sub in state):
                    return (i + k, None) if k else (i, self._label(state) if i > first else None)
                k += 1
                if k == width:
                    break
                if i + k >= n:
                    return -1, None  # the token ends inside a character that can still complete
                cont = data[i + k]
                if cont & 0xC0 != 0x80:
                    return i + k, None
                code = code << 6 | cont & 0x3F
            state = self._step(state, code)
            i += width
        return -1, None

    def _step(self, state: Subsets, code: int) -> Subsets:
        """Each piece's subset after the character `code` (the pieces left alive)."""
        key = (state, code)
        hit = self._steps.get(key)
        if hit is None:
            out = []
            for j, sub in state:
                piece = self._pieces[j]
                c = piece.class_of(code)
                nxt = piece.step(sub, c) if c >= 0 else frozenset()
                if nxt:
                    out.append((j, nxt))
            hit = self._steps[key] = tuple(out)
        return hit

    def _label(self, state: Subsets) -> tuple[str, ...] | None:
        labels = [j for j, sub in state if self._pieces[j].accepting(sub)]  # in preference order
        if not labels:
            return None
        if self._readings:
            return tuple(self._names[j] for j in labels)
        return (self._names[labels[0]],)


def probe_piece(node: ra.Node) -> Piece:
    """`node`'s piece: a LiteralPiece where it is one fixed string, else its NFA's."""
    codes = literal_codes(node)
    return LiteralPiece(codes) if codes is not None else ProbePiece(node)


def literal_codes(node: ra.Node) -> tuple[int, ...] | None:
    """The code points of the one nonempty string `node` reads, or None where it reads any other language."""
    items = node.items if isinstance(node, ra.Seq) else (node,)
    codes = []
    for item in items:
        if not isinstance(item, ra.Chars) or len(item.ranges) != 1 or item.ranges[0][0] != item.ranges[0][1]:
            return None
        codes.append(item.ranges[0][0])
    return tuple(codes) or None


def _reads_wide(ranges: list[tuple[int, int]], code: int, width: int, left: int) -> bool:
    """Whether some well-formed code point of `width` bytes starting with `code`'s bits (`left` continuation bytes
    still to come) lies in `ranges`."""
    lo, hi = code << 6 * left, ((code + 1) << 6 * left) - 1
    for x, y in _VALID[width]:
        x, y = max(x, lo), min(y, hi)
        if x <= y and any(a <= y and x <= b for a, b in ranges):
            return True
    return False


class LiteralPiece:
    """One fixed string's piece: its subset is {i}, the characters read so far; a character's class is its code
    point (-1: not in the string)."""

    def __init__(self, codes: tuple[int, ...]):
        self._codes = codes
        self._chars = frozenset(codes)
        self._at = [frozenset((i,)) for i in range(len(codes) + 1)]
        self.start: Subset = self._at[0]

    def class_of(self, code: int) -> int:
        return code if code in self._chars else -1

    def accepting(self, state: Subset) -> bool:
        return len(self._codes) in state

    def reads(self, state: Subset, code: int, width: int, left: int) -> bool:
        (i,) = state
        return i < len(self._codes) and _reads_wide([(self._codes[i], self._codes[i])], code, width, left)

    def step(self, state: Subset, c: int) -> Subset:
        (i,) = state
        return self._at[i + 1] if i < len(self._codes) and self._codes[i] == c else frozenset()


class ProbePiece:
    """One terminal's NFA over its own alphabet, walked a subset at a time (a lazy DFA)."""

    def __init__(self, node: ra.Node):
        alphabet = alphabet_of(char_sets([node]))
        embedded: list[tuple[int, int, CharDfa]] = []
        nfa, start = thompson([node], alphabet, nonempty=True, embedded=embedded)
        (self._end,) = nfa.accepts  # the terminal's one accepting state
        coreachable = _coreachable(nfa, embedded)
        self._size = len(nfa.eps)
        parts, entries, base = [], {}, self._size
        for entry, end, dfa in embedded:
            of_class = owning_classes(alphabet, dfa.alphabet).tolist()  # the piece's classes refine the DFA's
            kept = np.array((dfa.trans >= 0).any(axis=1) & (end in coreachable), bool)
            parts.append(_Embedded(base, end, dfa.trans, dfa.accept, of_class, kept))
            entries[entry] = base + dfa.start
            base += len(dfa.trans)
        self._keep = coreachable & ({q for q, edges in enumerate(nfa.edges) if edges} | set(nfa.accepts))
        self._moves = _EmptyMoves(nfa.eps, entries, parts)
        self._edges = nfa.edges
        self._reading: dict[int, list[tuple[frozenset[int], int]]] = {}  # by state met: its moves, as sets
        self._closures: dict[int, Subset] = {}
        self._steps: dict[tuple[Subset, int], Subset] = {}  # by subset and class: kept across the grammar's probes
        self._live: dict[Subset, list[tuple[int, int]]] = {}  # a subset's multi-byte code points it reads
        self._ascii = [-1] * 128  # by ASCII byte: its class
        intervals = []
        for c, ranges in enumerate(alphabet.classes):
            for lo, hi in ranges:
                intervals.append((lo, hi, c))
                for b in range(lo, min(hi, 127) + 1):
                    self._ascii[b] = c
        intervals.sort()
        self._los = [lo for lo, _, _ in intervals]
        self._intervals = intervals
        self._wide = [c for c in range(len(alphabet.classes)) if alphabet.widths[c] > 1]
        self._classes = alphabet.classes
        self.start = self._closure(start)

    def class_of(self, code: int) -> int:
        """The class holding the character `code`, or -1 where none of the terminal's sets hold it."""
        if code < 0x80:
            return self._ascii[code]
        k = bisect.bisect_right(self._los, code) - 1
        if k < 0:
            return -1
        lo, hi, c = self._intervals[k]
        return c if lo <= code <= hi else -1

    def accepting(self, state: Subset) -> bool:
        return self._end in state

    def reads(self, state: Subset, code: int, width: int, left: int) -> bool:
        """Whether some well-formed code point of `width` bytes starting with `code`'s bits (`left` continuation
        bytes still to come) lies in a class `state` reads."""
        return _reads_wide(self._live_ranges(state), code, width, left)

    def _live_ranges(self, state: Subset) -> list[tuple[int, int]]:
        hit = self._live.get(state)
        if hit is None:
            hit = self._live[state] = [r for c in self._wide if self.step(state, c) for r in self._classes[c]]
        return hit

    def step(self, state: Subset, c: int) -> Subset:
        """`state`'s subset after a character of class `c`."""
        key = (state, c)
        hit = self._steps.get(key)
        if hit is None:
            out: set[int] = set()
            for q in state:
                if q >= self._size:  # in an embedded DFA
                    part = self._moves.part(q)
                    k = part.of_class[c]
                    t = int(part.trans[q - part.base, k]) if k >= 0 else -1
                    if t >= 0:
                        out |= self._closure(part.base + t)
                    continue
                moves = self._reading.get(q)
                if moves is None:
                    moves = self._reading[q] = [(frozenset(symbols), t) for symbols, t in self._edges[q]]
                for symbols, t in moves:
                    if c in symbols:
                        out |= self._closure(t)
            hit = self._steps[key] = frozenset(out)
        return hit

    def _closure(self, q: int) -> Subset:
        """The states that read or accept (and can still reach acceptance) that q reaches without reading."""
        hit = self._closures.get(q)
        if hit is None:
            hit = self._closures[q] = frozenset(q for q in reach(self._moves, (q,)) if self._kept(q))
        return hit

    def _kept(self, q: int) -> bool:
        if q < self._size:
            return q in self._keep
        part = self._moves.part(q)
        return bool(part.kept[q - part.base])


Piece = LiteralPiece | ProbePiece  # a terminal's part of a probe


def _coreachable(nfa: Nfa, embedded: list[tuple[int, int, CharDfa]]) -> set[int]:
    """The NFA's states from which an accepting one can be reached (over moves that read something, or none,
    or through an embedded DFA whose language is not empty: trimmed, its start then reads or accepts)."""
    back: list[list[int]] = [[] for _ in nfa.eps]
    for entry, end, dfa in embedded:
        if dfa.accept[dfa.start] >= 0 or (dfa.trans[dfa.start] >= 0).any():
            back[end].append(entry)
    for q, targets in enumerate(nfa.eps):
        for t in targets:
            back[t].append(q)
    for q, edges in enumerate(nfa.edges):
        for symbols, t in edges:
            if len(symbols):
                back[t].append(q)
    return reach(back, nfa.accepts)
