"""Character DFAs -> byte DFAs: each state's character transitions become a small UTF-8 decoder.

A state's live classes, grouped by target, split code points into groups. The decoder of such a
split (a minimal byte DFA from an entry to one exit per group) is built once and cached: templates
repeat a few splits many times (`[\\w\\d\\s]{1,16}` has one split per count, all alike). Copies of
it are stamped into the byte table with numpy. Only well-formed UTF-8 is read: no overlong forms,
no surrogates.

The result is minimal when the character DFA is: two states mid-character are merged exactly when
they read the same continuation bytes into the same states (checked bottom-up, by bytes left).
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import numpy as np

from ..config import MAX_DFA_STATES, UTF8_DECODER_CACHE_SIZE
from . import regex_ast as ra
from .alphabet import CharDfa
from .fsa import row_ids, too_large

_CONTINUATION = slice(0x80, 0xC0)  # the only bytes a state mid-character reads
_WIDTH_FIRST = (0x80, 0x800, 0x10000)  # first code points of 2-, 3- and 4-byte UTF-8


@dataclass(frozen=True, slots=True)
class _Decoder:
    """Rows of the entry (row 0) and of the mid-character states. A value v < 0 is dead, v < groups
    exits to group v's target, else it is row v - groups."""

    rows: np.ndarray  # [M, 256] int32
    left: np.ndarray  # [M] bytes left until the character ends (0 for the entry)


def char_to_byte_dfa(dfa: CharDfa) -> tuple[np.ndarray, np.ndarray]:
    """(trans [S, 256], accept [S]) of the same language over bytes; character states keep their ids."""
    split_decoders: dict[tuple[tuple[int, ...], ...], _Decoder] = {}
    plans = []
    for row in dfa.trans.tolist():
        groups: dict[int, list[int]] = {}  # target -> classes, in class order (a canonical split)
        for c, t in enumerate(row):
            if t >= 0:
                groups.setdefault(t, []).append(c)
        split = tuple(map(tuple, groups.values()))
        if split not in split_decoders:
            merged = (ra.normalize(r for c in cs for r in dfa.alphabet.classes[c]) for cs in split)
            split_decoders[split] = _decoder(tuple(merged))
        plans.append((split_decoders[split], list(groups)))
    total = len(plans) + sum(len(d.rows) - 1 for d, _ in plans)
    if total > MAX_DFA_STATES:
        raise too_large()
    trans = np.empty((total, 256), np.int32)
    left = np.zeros(total, np.int8)
    base = len(plans)
    for state, (decoder, targets) in enumerate(plans):
        m = len(decoder.rows) - 1
        lookup = np.concatenate([[-1], targets, [state], np.arange(base, base + m)]).astype(np.int32)
        stamped = lookup[decoder.rows + 1]
        trans[state] = stamped[0]
        trans[base:base + m] = stamped[1:]
        left[base:base + m] = decoder.left[1:]
        base += m
    accept = np.concatenate([dfa.accept, np.full(total - len(plans), -1)]).astype(np.int32)
    return _merge_equal_tails(trans, left, accept)


def _merge_equal_tails(trans: np.ndarray, left: np.ndarray, accept: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merges mid-character states of different decoders that read alike (fewest bytes left first)."""
    rep = np.arange(len(trans) + 1, dtype=np.int32)
    rep[-1] = -1  # so that rep[-1] (dead) stays dead
    for n in (1, 2, 3):
        idx = np.flatnonzero(left == n)
        if len(idx) > 1:
            ids = row_ids(rep[trans[idx, _CONTINUATION]])
            rep[idx] = idx[np.unique(ids, return_index=True)[1][ids]]
    keep = rep[:-1] == np.arange(len(trans))
    if keep.all():
        return trans, accept
    new_id = np.append(np.cumsum(keep, dtype=np.int32) - 1, -1)[rep]
    return new_id[trans[keep]], accept[keep]


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
