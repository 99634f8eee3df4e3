"""Code-point classes: the coarsest partition of code points that all of a regex's character sets respect.

Regexes are determinized over these classes rather than over bytes: `"[\\w\\d\\s]{1,16}"` reads
three symbols (the quote, the letters inside the class, the other members of the class), not the
hundreds of UTF-8 byte paths of Unicode `\\w`. Classes never straddle a UTF-8 length, so every
class has one byte width. Code points outside every set belong to no class (they are dead).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from . import regex_ast as ra

_WIDTH_CUTS = (0x80, 0x800, 0x10000)  # first code points of 2-, 3- and 4-byte UTF-8
_SMALL_CUTS = 256  # inputs with at most this many interval bounds take the plain Python path (_small_alphabet)


@dataclass(slots=True)
class Alphabet:
    classes: tuple[ra.Ranges, ...]  # the code points of each class
    widths: np.ndarray  # [K] UTF-8 bytes per code point of each class
    members: dict[ra.Ranges, tuple[int, ...]]  # each given set as the classes it is made of


@dataclass(slots=True)
class CharDfa:
    """A DFA over an alphabet's classes, trimmed and minimal (see fsa)."""

    trans: np.ndarray  # [S, K], -1 = dead
    accept: np.ndarray  # [S]
    alphabet: Alphabet
    start: int = field(default=0, init=False)
    readings: tuple[tuple[int, ...], ...] = ()  # where built with readings: by label, every pattern it accepts


def alphabet_of(sets: Iterable[ra.Ranges]) -> Alphabet:
    """Classes of code points that belong to the same given sets and have the same UTF-8 width. Small inputs
    (most calls: a lexer's or a key set's few sets) in plain Python, large ones vectorised over all sets at once
    (a schema has hundreds: every literal character is one); the same answer either way."""
    sets = list(dict.fromkeys(sets))
    cuts = {0, ra.MAX_CODE_POINT + 1, *_WIDTH_CUTS}
    for ranges in sets:
        for lo, hi in ranges:
            cuts.update((lo, hi + 1))
    bounds = sorted(cuts)
    return _small_alphabet(sets, bounds) if len(bounds) <= _SMALL_CUTS else _numpy_alphabet(sets, bounds)


def owning_classes(fine: Alphabet, coarse: Alphabet) -> np.ndarray:
    """By class of `fine`, which refines `coarse` where they meet: the class of `coarse` holding it, or -1 (none):
    a class's first code point tells."""
    out = np.full(len(fine.classes), -1, np.int64)
    if fine.classes and coarse.classes:
        los, his, owner = (np.array(col, np.int64) for col in zip(*sorted(
            (lo, hi, c) for c, ranges in enumerate(coarse.classes) for lo, hi in ranges)))
        firsts = np.array([ranges[0][0] for ranges in fine.classes], np.int64)
        at = np.maximum(np.searchsorted(los, firsts, side="right") - 1, 0)
        inside = (los[at] <= firsts) & (firsts <= his[at])
        out[inside] = owner[at[inside]]
    return out


def _numpy_alphabet(sets: list[ra.Ranges], cuts: list[int]) -> Alphabet:
    """`alphabet_of` vectorised over all sets at once, for large inputs; `cuts`: every range's bounds, sorted."""
    bounds = np.array(cuts)
    starts = bounds[:-1]
    inside = _membership(sets, bounds)
    used = inside.any(axis=0)
    if not used.any():
        return Alphabet((), np.zeros(0, np.int64), {})
    width = np.searchsorted(_WIDTH_CUTS, starts, side="right") + 1
    signature = np.column_stack([width[used], inside[:, used].T]).astype(np.int64)
    _, first, of_interval = np.unique(signature, axis=0, return_index=True, return_inverse=True)
    of_interval = of_interval.ravel()
    los, his = starts[used].tolist(), (bounds[1:][used] - 1).tolist()
    by_class = np.argsort(of_interval, kind="stable")  # intervals of each class, in code-point order
    cuts_at = np.searchsorted(of_interval[by_class], np.arange(1, len(first))).tolist()
    classes = tuple(tuple((los[i], his[i]) for i in part) for part in np.split(by_class, cuts_at))
    has = np.zeros((len(sets), len(first)), bool)
    set_of, interval = np.nonzero(inside[:, used])
    has[set_of, of_interval[interval]] = True
    rows, cols = np.nonzero(has)
    per_set = np.split(cols, np.searchsorted(rows, np.arange(1, len(sets))))
    members = {ranges: tuple(part.tolist()) for ranges, part in zip(sets, per_set)}
    return Alphabet(classes, width[used][first], members)


def _small_alphabet(sets: list[ra.Ranges], bounds: list[int]) -> Alphabet:
    """`alphabet_of` in plain Python, the same classes in the same order: most calls (a lexer's or a key set's
    few sets) are small, where numpy's fixed cost per call was most of the time. An interval's signature is an
    int whose bits are the sets holding it, set 0 the highest, so sorting (width, signature) orders the classes
    as numpy's lexicographic unique of the (width, membership row) table does."""
    index = {b: i for i, b in enumerate(bounds)}
    count, top = len(bounds) - 1, len(sets) - 1
    signature = [0] * count
    for j, ranges in enumerate(sets):
        bit = 1 << (top - j)
        for lo, hi in ranges:
            for i in range(index[lo], index[hi + 1]):
                signature[i] |= bit
    widths = [bisect.bisect_right(_WIDTH_CUTS, b) + 1 for b in bounds[:-1]]  # UTF-8 bytes per interval
    groups: dict[tuple[int, int], list[tuple[int, int]]] = {}
    for i in range(count):
        if signature[i]:
            groups.setdefault((widths[i], signature[i]), []).append((bounds[i], bounds[i + 1] - 1))
    if not groups:
        return Alphabet((), np.zeros(0, np.int64), {})
    keys = sorted(groups)
    # each class's sets, from its signature's bits (a set per bit): a lexer's sets are mostly single characters in
    # one class each, where testing every set against every class was most of the call
    members_of: list[list[int]] = [[] for _ in sets]
    for c, (_, sig) in enumerate(keys):
        while sig:
            low = sig & -sig
            members_of[top - (low.bit_length() - 1)].append(c)
            sig ^= low
    members = {ranges: tuple(found) for ranges, found in zip(sets, members_of)}
    return Alphabet(tuple(tuple(groups[key]) for key in keys), np.array([w for w, _ in keys], np.int64), members)


def _membership(sets: list[ra.Ranges], bounds: np.ndarray) -> np.ndarray:
    """inside[j, i]: whether interval [bounds[i], bounds[i + 1]) lies in set j (ranges start and end
    at bounds, so each range is a run of intervals: +1 where it starts, -1 after it ends)."""
    owner = [j for j, ranges in enumerate(sets) for _ in ranges]
    flat = np.array([r for ranges in sets for r in ranges], np.int64).reshape(-1, 2)
    diff = np.zeros((len(sets), len(bounds)), np.int64)
    # numpy's stubs type ufunc.at's indices as one array, though numpy takes a tuple (one array per axis)
    np.add.at(diff, (owner, np.searchsorted(bounds, flat[:, 0])), 1)  # type: ignore[arg-type]
    np.add.at(diff, (owner, np.searchsorted(bounds, flat[:, 1] + 1)), -1)  # type: ignore[arg-type]
    return np.cumsum(diff, axis=1)[:, :-1] > 0
