"""Character DFAs -> byte DFAs: each state's character transitions become a small UTF-8 decoder.

ASCII classes map bytes to states directly (one gather for the whole table). A state's live multi-byte
classes, grouped by target, split code points into groups. The decoder of such a split (a minimal
byte DFA from an entry to one exit per group) is built once and cached: templates repeat a few splits
many times (`[\\w\\d\\s]{1,16}` has one split per count, all alike), and most splits are "every
non-ASCII character", whatever the schema. Each state stamps a copy of its decoder into the table.
Only well-formed UTF-8 is read: no overlong forms, no surrogates.

The result is minimal when the character DFA is: two states mid-character are merged exactly when
they read the same continuation bytes into the same states (interned bottom-up, by bytes left).

The table's columns are byte classes, not bytes: bytes that every row maps alike (the ASCII
characters of one class, the lead or continuation bytes every decoder reads alike) share a column,
so a state costs ~12-30 entries rather than 256, and the bound is on the table (MAX_DFA_TRANSITIONS).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ...config import MAX_DFA_TRANSITIONS, UTF8_DECODER_CACHE_SIZE
from . import regex_ast as ra
from .alphabet import CharDfa
from .fsa import ConstraintTooLarge, hash_weights, row_ids

_CONTINUATION = slice(0x80, 0xC0)  # the only bytes a state mid-character reads
_WIDTH_FIRST = (0x80, 0x800, 0x10000)  # first code points of 2-, 3- and 4-byte UTF-8


@dataclass(frozen=True, slots=True)
class _Decoder:
    """Rows of the entry (row 0) and of the mid-character states. A value v < 0 is dead, v < groups
    exits to group v's target, else it is row v - groups."""

    rows: np.ndarray  # [M, 256] int32
    left: np.ndarray  # [M] bytes left until the character ends (0 for the entry)


def char_to_byte_dfa(dfa: CharDfa) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(trans [S, K], byte_class [256], accept [S]) of the same language over bytes, its columns byte
    classes (bytes every row maps alike share one); character states keep their ids. ASCII transitions
    are one gather for all states; only multi-byte classes go through decoders."""
    classes, widths = dfa.alphabet.classes, dfa.alphabet.widths
    ascii_class = np.full(256, -1, np.int64)
    for c in np.flatnonzero(widths == 1).tolist():
        for lo, hi in classes[c]:
            ascii_class[lo:hi + 1] = c
    split_decoders: dict[tuple[tuple[int, ...], ...], _Decoder] = {}
    stamps = _splits(dfa.trans, np.flatnonzero(widths > 1))  # by split: its states, and their targets
    for split in stamps:
        merged = (ra.normalize(r for c in cs for r in classes[c]) for cs in split)
        split_decoders[split] = _decoder(tuple(merged))
    byte_class, firsts = _byte_classes(dfa.trans, ascii_class, list(split_decoders.values()))
    width = len(firsts)
    entries = np.full((len(dfa.trans), width), -1, np.int32)
    ascii_cols = np.flatnonzero(ascii_class[firsts] >= 0)
    entries[:, ascii_cols] = dfa.trans[:, ascii_class[firsts[ascii_cols]]]
    high_cols = np.flatnonzero(firsts >= 0x80)
    tails = _Tails(len(dfa.trans), width)
    if len(dfa.trans) > tails.max_states:
        raise tails.too_large()
    for split, decoder in split_decoders.items():  # every state of one split at once
        states, targets = stamps[split]
        rows = tails.stamp(decoder.rows[:, firsts], decoder.left, targets)
        entries[states[:, None], high_cols] = rows[:, high_cols]
    trans = np.concatenate([entries, tails.rows]) if tails.count else entries
    accept = np.concatenate([dfa.accept, np.full(tails.count, -1)]).astype(np.int32)
    return trans, byte_class, accept


_SPLIT_CHUNK = 1 << 22  # (state, class, class) triples compared at once by _splits


def _splits(trans: np.ndarray, high: np.ndarray) -> dict[tuple[tuple[int, ...], ...], tuple[np.ndarray, np.ndarray]]:
    """The character states that read a multi-byte class, by split: the live multi-byte classes (columns `high`)
    grouped by target, the groups ordered by their first class (a canonical split), the splits in the order of
    their first state. Each split's states (ascending) and their targets [states, groups], group by group.
    Vectorised: a state's split is the pattern of its targets' first occurrences along its row."""
    width = len(high)
    rows = trans[:, high]
    states = np.flatnonzero((rows >= 0).any(axis=1)) if width else np.zeros(0, np.int64)
    rows = rows[states]
    labels = np.empty(rows.shape, np.int64)  # each class's group in its state's split (-1: dead)
    firsts = np.empty(rows.shape, bool)  # whether a class is its group's first
    step = max(1, _SPLIT_CHUNK // max(width * width, 1))
    for at in range(0, len(rows), step):
        block = rows[at:at + step]
        first = (block[:, :, None] == block[:, None, :]).argmax(axis=2)  # where each class's target first occurs
        is_first = (first == np.arange(width)) & (block >= 0)
        labels[at:at + step] = np.where(block >= 0, np.take_along_axis(is_first.cumsum(axis=1) - 1, first, axis=1), -1)
        firsts[at:at + step] = is_first
    keys = labels.astype(np.int16).tobytes()
    size = 2 * width
    order: dict[bytes, int] = {}
    group = np.array([order.setdefault(keys[i * size:(i + 1) * size], len(order)) for i in range(len(rows))], np.int64)
    out: dict[tuple[tuple[int, ...], ...], tuple[np.ndarray, np.ndarray]] = {}
    for g in range(len(order)):
        members = np.flatnonzero(group == g)
        label = labels[members[0]]
        split = tuple(tuple(high[label == k].tolist()) for k in range(int(label.max()) + 1))
        targets = rows[members][:, np.flatnonzero(firsts[members[0]])].astype(np.int32)
        out[split] = (states[members], targets)
    return out


def _byte_classes(trans: np.ndarray, ascii_class: np.ndarray,
                  decoders: list[_Decoder]) -> tuple[np.ndarray, np.ndarray]:
    """(each byte's column, a byte of each column): two bytes are one column where every decoder row
    reads them alike and, for ASCII, their character classes' columns are equal (or both dead)."""
    ascii_key = np.full(256, -1, np.int64)
    if trans.shape[1]:
        # each column as one opaque value: np.unique(axis=1) views an S-long column as S fields, which was most
        # of a long chain's byte conversion (row_ids would cache hash weights per S)
        columns = np.ascontiguousarray(trans.T)
        keys = columns.view(np.dtype((np.void, columns.shape[1] * columns.itemsize))).ravel()
        column = np.where((trans >= 0).any(axis=0), np.unique(keys, return_inverse=True)[1].ravel(), -1)
        ascii_key = np.where(ascii_class >= 0, column[np.maximum(ascii_class, 0)], -1)
    return _distinct_rows(np.column_stack([ascii_key, *(d.rows.T for d in decoders)]))


def _distinct_rows(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(each row's number, each number's first row): `np.unique(rows, axis=0, return_inverse=True,
    return_index=True)`'s numbering (distinct rows in lexicographic order) by a stable lexsort, at a fraction of
    its cost (it sorts a structured copy of the rows)."""
    order = np.lexsort(rows.T[::-1])
    ordered = rows[order]
    starts = np.ones(len(order), bool)
    starts[1:] = (ordered[1:] != ordered[:-1]).any(axis=1)
    number = np.empty(len(order), np.int64)
    number[order] = np.cumsum(starts) - 1
    return number, order[starts]


# a byte table interns its mid-character rows by dict until it holds this many, then by hash in numpy (_Tails)
_HASHED_FROM = 2048


class _Tails:
    """The mid-character states of the byte DFA, hash-consed: copies of decoder rows that read the same
    continuation bytes into the same states are one state. Interning while stamping (bytes-left order,
    so a row's children are final before it) keeps the state limit on the merged DFA: many character
    states' decoders share most of their rows. Rows are looked up in a dict of their bytes while few;
    past _HASHED_FROM, by a 64-bit hash of each row, in numpy for a whole block at once, each hit checked
    against the row kept (a long bounded string's chain interns tens of thousands, where the dict's lookup
    per row was most of its conversion; numpy's fixed cost per block would be most of a small table's)."""

    def __init__(self, first_id: int, width: int) -> None:
        self.first_id, self.width = first_id, width
        self.max_states = MAX_DFA_TRANSITIONS // max(width, 1)  # the bound is on the table's size
        self.count = 0  # states interned
        self._kept = np.zeros((0, width), np.int32)  # by state - first_id: its row (room doubled as it fills)
        self._ids: dict[bytes, int] | None = {}  # by a row's bytes, its state (None: hashed from now on)
        self._weights = hash_weights(width)
        self._keys = np.zeros(0, np.int64)  # hashed: the interned rows' hashes, sorted
        self._key_ids = np.zeros(0, np.int64)  # their states, in that order

    @property
    def rows(self) -> np.ndarray:
        """The interned states' rows, in state order."""
        return self._kept[:self.count]

    def stamp(self, rows: np.ndarray, left: np.ndarray, targets: np.ndarray) -> np.ndarray:
        """The entry rows [N, K] of N character states whose transitions one decoder (`rows` over the byte
        columns, `left` per row) reads into `targets` [N, groups], their mid-character rows interned."""
        count, groups = targets.shape
        # decoder value v -> byte DFA state: dead, a group's target, or a mid-character row (the entry's
        # slot, v == groups, stays dead: no decoder row leads back to it); a lookup row per state
        lookup = np.full((count, 1 + groups + len(rows)), -1, np.int32)
        lookup[:, 1:groups + 1] = targets
        for height in (1, 2, 3):
            level = np.flatnonzero(left == height)
            if not level.size:
                break
            stamped = lookup[:, rows[level] + 1]  # [N, rows of this height, K]
            lookup[:, groups + 1 + level] = self._intern(stamped.reshape(-1, self.width)).reshape(count, -1)
        return lookup[:, rows[0] + 1]

    def _intern(self, block: np.ndarray) -> np.ndarray:
        """The state of each row of `block`: an equal row's, or a new one (numbered by first occurrence)."""
        local = row_ids(block)
        firsts = np.sort(np.unique(local, return_index=True)[1])
        distinct = np.ascontiguousarray(block[firsts], np.int32)
        if self._ids is not None and self.count + len(firsts) > _HASHED_FROM:
            self._to_hashed()
        state = self._by_dict(distinct) if self._ids is not None else self._by_hash(distinct)
        if self.first_id + self.count > self.max_states:
            raise self.too_large()
        by_local = np.empty(len(firsts), np.int64)
        by_local[local[firsts]] = state
        return by_local[local]

    def _by_dict(self, distinct: np.ndarray) -> np.ndarray:
        assert self._ids is not None
        data, size = distinct.tobytes(), distinct.shape[1] * distinct.itemsize
        state = np.empty(len(distinct), np.int64)
        fresh: list[int] = []
        for j in range(len(distinct)):
            key = data[j * size:(j + 1) * size]
            hit = self._ids.get(key)
            if hit is None:
                hit = self._ids[key] = self.first_id + self.count + len(fresh)
                fresh.append(j)
            state[j] = hit
        if fresh:
            self._keep(distinct[fresh])
        return state

    def _to_hashed(self) -> None:
        """Looks the interned rows up by hash from now on (once a table holds many)."""
        self._ids = None
        self._file(self._hashes(self.rows), self.first_id + np.arange(self.count))

    def _by_hash(self, distinct: np.ndarray) -> np.ndarray:
        keys = self._hashes(distinct)
        state = np.full(len(distinct), -1, np.int64)
        if len(self._keys):
            at = np.minimum(np.searchsorted(self._keys, keys), len(self._keys) - 1)
            hit = self._keys[at] == keys
            state[hit] = self._key_ids[at[hit]]
            if hit.any():  # a hash is not a row: each hit checked against the row kept
                wrong = np.flatnonzero(hit)[(self._kept[state[hit] - self.first_id] != distinct[hit]).any(axis=1)]
                for j in wrong.tolist():  # a collision (about 2**-64 a pair): the kept rows searched whole
                    same = np.flatnonzero((self.rows == distinct[j]).all(axis=1))
                    state[j] = self.first_id + same[0] if len(same) else -1
        fresh = np.flatnonzero(state < 0)
        if len(fresh):
            state[fresh] = self.first_id + self.count + np.arange(len(fresh))
            self._keep(distinct[fresh])
            self._file(keys[fresh], state[fresh])
        return state

    def _keep(self, rows: np.ndarray) -> None:
        """Interns `rows` as the next states."""
        end = self.count + len(rows)
        if end > len(self._kept):
            kept = np.empty((max(2 * len(self._kept), end, 256), self.width), np.int32)
            kept[:self.count] = self.rows
            self._kept = kept
        self._kept[self.count:end] = rows
        self.count = end

    def _hashes(self, rows: np.ndarray) -> np.ndarray:
        return rows.astype(np.int64) @ self._weights  # wraps modulo 2**64, as row_ids' hash

    def _file(self, keys: np.ndarray, states: np.ndarray) -> None:
        """Files interned rows (their hashes `keys`, their states `states`) for lookups by hash."""
        order = np.argsort(keys, kind="stable")
        at = np.searchsorted(self._keys, keys[order])  # merged in: the filed keys stay sorted
        self._keys, self._key_ids = np.insert(self._keys, at, keys[order]), np.insert(self._key_ids, at, states[order])

    def too_large(self) -> ConstraintTooLarge:
        return ConstraintTooLarge(f"constraint is too large: its byte DFA exceeds {MAX_DFA_TRANSITIONS} transitions "
                                  f"({self.max_states} states of {self.width} byte classes)")


@functools.lru_cache(maxsize=UTF8_DECODER_CACHE_SIZE)
def _decoder(groups: tuple[ra.Ranges, ...]) -> _Decoder:
    """The minimal byte DFA reading one character of some group and exiting by that group.

    The n-byte encodings of code points [0, 2**(5n+1)) are the lead bytes 0xC0/0xE0/0xF0 onwards
    followed by 6-bit continuations, so 64 consecutive code points share all bytes but the last:
    a mid-character state is one 64-wide row of its children, and equal rows are merged level by level.
    """
    top = max((hi for ranges in groups for _, hi in ranges), default=0)
    label = np.full(max(0x80, 1 << (5 * _width(top) + 1)), -1, np.int32)
    for g, ranges in enumerate(groups):
        for lo, hi in ranges:
            label[lo:hi + 1] = g
    codes = {n: np.where(np.arange(1 << (5 * n + 1)) < first, -1, label[:1 << (5 * n + 1)])
             for n, first in zip((2, 3, 4), _WIDTH_FIRST) if top >= first}
    rows, left = [np.full((1, 256), -1, np.int32)], [0]
    for height in (1, 2, 3):
        widths = [n for n in codes if n > height]
        if not widths:
            break
        children = np.concatenate([codes[n].reshape(-1, 64) for n in widths])
        ids = row_ids(children)
        firsts = np.unique(ids, return_index=True)[1]
        live = (children[firsts] >= 0).any(axis=1)  # the all-dead row is no state
        node = np.full(len(firsts), -1, np.int32)
        node[live] = len(groups) + sum(map(len, rows)) + np.arange(live.sum())
        block = np.full((int(live.sum()), 256), -1, np.int32)
        block[:, _CONTINUATION] = children[firsts[live]]
        rows.append(block)
        left += [height] * len(block)
        ends = np.cumsum([len(codes[n]) // 64 for n in widths])
        codes |= {n: node[part] for n, part in zip(widths, np.split(ids, ends[:-1]))}
    entry = rows[0][0]
    entry[:0x80] = label[:0x80]
    for n, lead in ((2, 0xC0), (3, 0xE0), (4, 0xF0)):
        if n in codes:
            entry[lead:lead + len(codes[n])] = codes[n]
    return _Decoder(np.concatenate(rows), np.array(left, np.int8))


def _width(cp: int) -> int:
    """UTF-8 bytes of code point cp."""
    return 1 + sum(cp >= first for first in _WIDTH_FIRST)
