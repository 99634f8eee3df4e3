"""Code-point classes: the coarsest partition of code points that all of a regex's character sets respect.

Regexes are determinized over these classes rather than over bytes: `"[\\w\\d\\s]{1,16}"` reads
three symbols (the quote, the letters inside the class, the other members of the class), not the
hundreds of UTF-8 byte paths of Unicode `\\w`. Classes never straddle a UTF-8 length, so every
class has one byte width. Code points outside every set belong to no class (they are dead).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import numpy as np

from . import regex_ast as ra

_WIDTH_CUTS = (0x80, 0x800, 0x10000)  # first code points of 2-, 3- and 4-byte UTF-8


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
    """Classes of code points that belong to the same given sets and have the same UTF-8 width.
    Vectorised over all sets at once (a schema has hundreds: every literal character is one)."""
    sets = list(dict.fromkeys(sets))
    cuts = {0, ra.MAX_CODE_POINT + 1, *_WIDTH_CUTS}
    for ranges in sets:
        for lo, hi in ranges:
            cuts.update((lo, hi + 1))
    bounds = np.array(sorted(cuts))
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
