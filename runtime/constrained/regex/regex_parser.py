"""Python regex text -> `regex_ast` tree, using the standard library's own regex parser.

The stdlib parser (`re._parser`) gives exactly Python's syntax, so `re.fullmatch` is a faithful
oracle. Only the regular subset is accepted: look-arounds, back-references, word boundaries,
conditionals, possessive/atomic groups and anchors away from the pattern's ends raise ValueError.
"""
from __future__ import annotations

import _sre  # type: ignore[import-not-found]  # typeshed has no stub for the C module behind `re`
import functools
import re
from typing import Any

import numpy as np

from . import regex_ast as ra

try:  # Python >= 3.11
    from re import _constants as C  # type: ignore[attr-defined]
    from re import _parser as sre_parse  # type: ignore[attr-defined]
except ImportError:  # pragma: no cover - Python 3.10
    import sre_constants as C
    import sre_parse

_UNSUPPORTED = {
    C.ASSERT: "look-ahead/look-behind", C.ASSERT_NOT: "negative look-around",
    C.GROUPREF: "back-reference", C.GROUPREF_EXISTS: "conditional group",
}
if hasattr(C, "POSSESSIVE_REPEAT"):
    _UNSUPPORTED[C.POSSESSIVE_REPEAT] = "possessive repeat"
    _UNSUPPORTED[C.ATOMIC_GROUP] = "atomic group"
_START_ANCHORS = {C.AT_BEGINNING, C.AT_BEGINNING_STRING}
_END_ANCHORS = {C.AT_END, C.AT_END_STRING}


def parse_regex(pattern: str, allowed: ra.Ranges | None = None) -> ra.Node:
    """Parses `pattern` (Python syntax) for full-match semantics.

    `allowed` (optional) restricts every character class to those code points, e.g. to the
    characters a JSON string may hold unescaped.
    """
    if not isinstance(pattern, str):
        raise ValueError(f"regex must be a string, got {type(pattern).__name__}")
    try:
        parsed = sre_parse.parse(pattern)
    except re.error as e:
        raise ValueError(f"invalid regex {pattern!r}: {e}") from None
    items = _strip_edge_anchors(list(parsed))
    return _Converter(pattern, allowed).seq(items, parsed.state.flags)


def _strip_edge_anchors(items: list) -> list:
    """`^`/`\\A` at the start and `$`/`\\Z` at the end are no-ops under full-match semantics."""
    while items and items[0][0] is C.AT and items[0][1] in _START_ANCHORS:
        items = items[1:]
    while items and items[-1][0] is C.AT and items[-1][1] in _END_ANCHORS:
        items = items[:-1]
    return items


class _Converter:
    def __init__(self, pattern: str, allowed: ra.Ranges | None):
        self.pattern = pattern
        self.allowed = allowed

    def fail(self, what: str) -> ValueError:
        return ValueError(f"regex {self.pattern!r} uses {what}, which constrained decoding does not support")

    def seq(self, items: list, flags: int) -> ra.Node:
        return ra.seq(*(self.item(op, av, flags) for op, av in items))

    def item(self, op: int, av: Any, flags: int) -> ra.Node:  # noqa: ANN401 - av's shape is op's: int, tuple, list
        if op in _UNSUPPORTED:
            raise self.fail(_UNSUPPORTED[op])
        if op is C.LITERAL:
            return self.charset(_fold(((av, av),), flags))
        if op is C.NOT_LITERAL:
            return self.charset(ra.complement(_fold(((av, av),), flags)))
        if op is C.ANY:
            return self.charset(ra.complement(()) if flags & re.DOTALL else ra.complement(((10, 10),)))
        if op is C.IN:
            return self.charset(self.class_ranges(av, flags))
        if op is C.BRANCH:
            return ra.alt(*(self.seq(list(branch), flags) for branch in av[1]))
        if op is C.SUBPATTERN:
            _group, add, remove, sub = av
            return self.seq(list(sub), (flags | add) & ~remove)
        if op in (C.MAX_REPEAT, C.MIN_REPEAT):
            lo, hi, sub = av
            return ra.repeat(self.seq(list(sub), flags), lo, None if hi is C.MAXREPEAT else hi)
        if op is C.AT:
            raise self.fail(f"the anchor {av} away from the pattern's start or end")
        raise self.fail(f"the construct {op}")

    def charset(self, ranges: ra.Ranges) -> ra.Node:
        if self.allowed is not None:
            ranges = ra.intersect(ranges, self.allowed)
        return ra.chars(ranges)

    def class_ranges(self, items: list, flags: int) -> ra.Ranges:
        negate, ranges = False, []
        for op, av in items:
            if op is C.NEGATE:
                negate = True
            elif op is C.LITERAL:
                ranges.append((av, av))
            elif op is C.RANGE:
                ranges.append(av)
            elif op is C.CATEGORY:
                ranges.extend(_category(av, bool(flags & re.ASCII)))
            else:
                raise self.fail(f"the class item {op}")
        folded = _fold(ra.normalize(ranges), flags)
        return ra.complement(folded) if negate else folded


def _fold(ranges: ra.Ranges, flags: int) -> ra.Ranges:
    """Adds every code point IGNORECASE makes equal to one in `ranges`."""
    ranges = ra.normalize(ranges)
    if not flags & re.IGNORECASE:
        return ranges
    keys, variants = _case_variants(bool(flags & re.ASCII))
    extra: list[tuple[int, int]] = []
    for lo, hi in ranges:
        for i in range(np.searchsorted(keys, lo), np.searchsorted(keys, hi, side="right")):
            extra.extend((v, v) for v in variants[i])
    return ra.normalize(list(ranges) + extra)


@functools.cache
def _case_variants(ascii_only: bool) -> tuple[np.ndarray, list[tuple[int, ...]]]:
    """Each cased code point (sorted) and every code point `(?i)` matches it with, found by running `re`
    itself: Python's simple case mappings plus its extra equivalences (s ~ ſ, k ~ Kelvin sign,
    i ~ ı ~ İ, µ ~ μ) are followed exactly. No uncased code point matches a cased one."""
    if ascii_only:
        cased = [cp for cp in range(0x80) if chr(cp).isalpha()]
    else:
        every = range(ra.MAX_CODE_POINT + 1)
        cased = [cp for cp, is_cased in zip(every, map(_sre.unicode_iscased, every)) if is_cased]
    text = "".join(map(chr, cased))
    flags = re.IGNORECASE | (re.ASCII if ascii_only else 0)
    variants = [tuple(map(ord, re.findall(re.escape(chr(cp)), text, flags))) for cp in cased]
    return np.array(cased), variants


_CATEGORY_REGEX = {"DIGIT": r"\d", "SPACE": r"\s", "WORD": r"\w"}


def _category(cat: int, ascii_only: bool) -> ra.Ranges:
    name = str(cat).upper()
    negated = "NOT_" in name
    base = next((k for k in _CATEGORY_REGEX if name.endswith(k)), None)
    if base is None:
        raise ValueError(f"regex category {cat} is not supported")
    ranges = _category_ranges(base, ascii_only)
    return ra.complement(ranges) if negated else ranges


@functools.cache
def _category_ranges(base: str, ascii_only: bool) -> ra.Ranges:
    """The code points Python's `re` puts in \\d, \\s or \\w, found by running `re` itself."""
    text = _every_code_point()[:0x80] if ascii_only else _every_code_point()
    flags = re.ASCII if ascii_only else 0
    found = [(m.start(), m.end() - 1) for m in re.finditer(_CATEGORY_REGEX[base] + "+", text, flags)]
    return ra.normalize(found)


@functools.cache
def _every_code_point() -> str:
    """All code points in order, surrogates included (numpy builds it ~15x faster than chr())."""
    return np.arange(ra.MAX_CODE_POINT + 1, dtype="<u4").tobytes().decode("utf-32-le", "surrogatepass")
