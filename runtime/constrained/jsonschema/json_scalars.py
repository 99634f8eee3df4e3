"""Regex trees for JSON scalars: strings (lengths, patterns, formats, every spelling of a value) and
numbers (exact decimal bounds, integer multiples). Numbers are written without exponent when bounded.
"""
from __future__ import annotations

import functools
import json
from decimal import Decimal

import numpy as np

from ...config import JSON_MAX_EXPONENT_DIGITS, JSON_MAX_FRACTION_DIGITS, JSON_MAX_INT_DIGITS
from ..regex import regex_ast as ra
from ..regex.alphabet import CharDfa, alphabet_of
from ..regex.automaton import difference, intersection, length_range
from ..regex.regex_parser import parse_regex

DIGIT = ra.char_class("0-9")
_HEX = ra.char_class("0-9a-fA-F")
# what a JSON string may hold without escaping: no quote, backslash or control character
STRING_CHARS = ra.complement(ra.normalize([(0, 0x1F), (ord('"'), ord('"')), (ord("\\"), ord("\\"))]))
_ESCAPE = ra.alt(
    ra.seq(ra.literal("\\"), ra.char_class('"\\/bfnrt')),
    # \\u escapes outside the surrogate block, so every escape is exactly one character
    ra.seq(ra.literal("\\u"), ra.alt(ra.seq(ra.char_class("0-9a-cA-Ce-fE-F"), ra.repeat(_HEX, 3, 3)),
                                     ra.seq(ra.char_class("dD"), ra.char_class("0-7"), ra.repeat(_HEX, 2, 2)))),
)
STRING_CHAR = ra.alt(ra.Chars(STRING_CHARS), _ESCAPE)
_SHORT_ESCAPES = {'"': '"', "\\": "\\", "/": "/", "\b": "b", "\f": "f", "\n": "n", "\r": "r", "\t": "t"}


def _r(pattern: str) -> ra.Node:
    return parse_regex(pattern)


# year 0000 is RFC 3339's but not a date to Python's date.fromisoformat (what jsonschema checks with): left out
_DATE = _r(r"(?:[0-9]{3}[1-9]|[0-9]{2}[1-9]0|[0-9][1-9]00|[1-9]000)-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
           r"|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_TIME = _r(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
_LABEL = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]{0,61}[a-zA-Z0-9])?"
_HOSTNAME = rf"{_LABEL}(?:\.{_LABEL}){{0,5}}"
_IPV4 = r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"
_H16 = "[0-9a-fA-F]{1,4}"
def _ipv6() -> str:
    """Eight groups, or a '::' standing for at least one zero group with a before and b after (a + b <= 7)."""
    def groups(n: int) -> str:
        return rf"{_H16}(?::{_H16}){{{n - 1}}}" if n else ""

    def upto(n: int) -> str:
        return rf"(?:{_H16}(?::{_H16}){{0,{n - 1}}})?" if n else ""

    return "|".join([groups(8)] + [rf"{groups(a)}::{upto(7 - a)}" for a in range(8)])


_IPV6 = _ipv6()
_PCHAR = r"(?:[a-zA-Z0-9\-._~!$&'()*+,;=:@]|%[0-9a-fA-F]{2})"  # RFC 3986 path characters
_PCHAR_NC = r"(?:[a-zA-Z0-9\-._~!$&'()*+,;=@]|%[0-9a-fA-F]{2})"  # the same but ':'
_REG_NAME = r"(?:[a-zA-Z0-9\-._~!$&'()*+,;=]|%[0-9a-fA-F]{2})*"
_AUTHORITY = rf"(?:{_REG_NAME.replace(']|', ':]|', 1)}@)?{_REG_NAME}(?::[0-9]{{1,5}})?"
_TAIL = rf"(?:\?(?:{_PCHAR}|[/?])*)?(?:#(?:{_PCHAR}|[/?])*)?"  # query, fragment
_SEGMENTS = rf"(?:/{_PCHAR}*)*"
_URI = (rf"[a-zA-Z][a-zA-Z0-9+.\-]*:(?://{_AUTHORITY}{_SEGMENTS}|/(?:{_PCHAR}+{_SEGMENTS})?"
        rf"|{_PCHAR}+{_SEGMENTS}|){_TAIL}")
_RELATIVE = rf"(?://{_AUTHORITY}{_SEGMENTS}|/(?:{_PCHAR}+{_SEGMENTS})?|{_PCHAR_NC}+{_SEGMENTS}|){_TAIL}"
_N = "[0-9]{1,9}"
_DUR_TIME = rf"T(?:{_N}H(?:{_N}M(?:{_N}S)?)?|{_N}M(?:{_N}S)?|{_N}S)"
_DURATION = rf"P(?:(?:{_N}D|{_N}M(?:{_N}D)?|{_N}Y(?:{_N}M(?:{_N}D)?)?)(?:{_DUR_TIME})?|{_DUR_TIME}|{_N}W)"
FORMATS: dict[str, ra.Node] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": ra.seq(_DATE, ra.literal("T"), _TIME),
    "duration": _r(_DURATION),
    "email": _r(r"[a-zA-Z0-9._%+-]{1,64}@[a-zA-Z0-9-]{1,63}(?:\.[a-zA-Z0-9-]{1,63}){0,3}\.[a-zA-Z]{2,8}"),
    "uuid": _r(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
    "ipv4": _r(_IPV4),
    "ipv6": _r(_IPV6),
    "hostname": _r(_HOSTNAME),
    "uri": _r(_URI),
    "uri-reference": _r(rf"{_URI}|{_RELATIVE}"),
}
FORMATS["url"] = FORMATS["uri"]


# ---- strings ------------------------------------------------------------------------------------
def string_node(lo: int = 0, hi: int | None = None) -> ra.Node:
    return ra.seq(ra.literal('"'), string_body(lo, hi), ra.literal('"'))


def string_body(lo: int = 0, hi: int | None = None) -> ra.Node:
    return ra.repeat(STRING_CHAR, lo, hi)


def quoted(body: ra.Node) -> ra.Node:
    return ra.seq(ra.literal('"'), body, ra.literal('"'))


def spellings(text: str) -> ra.Node:
    """Every JSON string body that decodes to `text`: each character raw (when allowed) or escaped."""
    return ra.seq(*(_char_spellings(ch) for ch in text))


@functools.lru_cache(maxsize=4096)
def _char_spellings(ch: str) -> ra.Node:
    cp = ord(ch)
    options = [ra.seq(ra.literal("\\u"), *(_hex_digit(d) for d in f"{cp:04x}"))] if cp <= 0xFFFF else []
    if ch in _SHORT_ESCAPES:
        options.append(ra.literal("\\" + _SHORT_ESCAPES[ch]))
    if ra.intersect(STRING_CHARS, ((cp, cp),)):
        options.append(ra.literal(ch))
    return ra.alt(*options)


def _hex_digit(d: str) -> ra.Node:
    return ra.char_class(d + d.upper()) if d.isalpha() else ra.literal(d)


def pattern_body(pattern: object, path: str) -> ra.Node:
    """A string `pattern` (search semantics, so unanchored ends match anything), raw characters only.
    Each top-level alternative is anchored on its own (`^a$|^b$`)."""
    if not isinstance(pattern, str):
        raise ValueError(f"json_schema pattern at {path} must be a string")
    inner = _unwrapped(pattern)
    if inner is not None:  # "(^a$)": a group around it all matches what its inside matches
        return pattern_body(inner, path)
    branches = _top_level_alternatives(pattern)
    if len(branches) > 1:
        return ra.alt(*(pattern_body(b, path) for b in branches))
    look = _leading_look_ahead(pattern)
    if look is not None:  # "^(?!X)Y": the strings Y matches less those that start with X (with "?=": and)
        negative, ahead, rest = look
        starts = ra.alt(*(pattern_body(b if b.startswith("^") else "^" + b, path) for b in _top_level_alternatives(ahead)))
        body = pattern_body("^" + rest, path)
        return compiled_or_nothing(difference(body, starts) if negative else intersection([body, starts]))
    try:
        node = parse_regex(pattern, allowed=STRING_CHARS)
    except ValueError as e:
        raise ValueError(f"json_schema pattern at {path}: {e}") from None
    anything = ra.repeat(ra.Chars(STRING_CHARS), 0, None)
    head = ra.EMPTY if pattern.startswith(("^", "\\A")) else anything
    tail = ra.EMPTY if pattern.endswith(("$", "\\Z")) and not pattern.endswith("\\$") else anything
    return ra.seq(head, node, tail)


def _top_level_alternatives(pattern: str) -> list[str]:
    """`pattern` split at the '|'s outside groups and classes."""
    out, start = [], 0
    for i, ch, depth in _structure(pattern):
        if ch == "|" and depth == 0:
            out.append(pattern[start:i])
            start = i + 1
    return out + [pattern[start:]]


def _leading_look_ahead(pattern: str) -> tuple[bool, str, str] | None:
    """(negative, inside, rest) of a pattern "^(?!inside)rest" or "^(?=inside)rest", else None."""
    if not pattern.startswith(("^(?!", "^(?=")):
        return None
    for i, ch, depth in _structure(pattern):
        if ch == ")" and depth == 0:
            return pattern[3] == "!", pattern[4:i], pattern[i + 1:]
    return None


def _unwrapped(pattern: str) -> str | None:
    """The inside of a plain or non-capturing group that spans the whole pattern, else None."""
    opening = 3 if pattern.startswith("(?:") else 1 if pattern.startswith("(") and not pattern.startswith("(?") else 0
    if not opening:
        return None
    for i, ch, depth in _structure(pattern):
        if ch == ")" and depth == 0:
            return pattern[opening:-1] if i == len(pattern) - 1 else None
    return None


def _structure(pattern: str):
    """(index, character, group depth after it) for each character outside escapes and classes."""
    depth, i, class_start = 0, 0, -1
    while i < len(pattern):
        ch = pattern[i]
        if ch == "\\":
            i += 2
            continue
        if class_start >= 0:  # a ']' first in the class (after an optional '^') is a literal
            first = i == class_start + 1 or (i == class_start + 2 and pattern[class_start + 1] == "^")
            if ch == "]" and not first:
                class_start = -1
        elif ch == "[":
            class_start = i
        else:
            if ch in "()":
                depth += 1 if ch == "(" else -1
            yield i, ch, depth
        i += 1


def constrained_string(bodies: list[ra.Node], lo: int, hi: int | None) -> ra.Node:
    """A quoted string whose body matches every one of `bodies` and has lo..hi characters. A bound that a
    body's own lengths imply is left out: its product would count characters for nothing (a format such as
    email, at most 254 characters, under `maxLength: 1024` made a 47k-state product minimizing to 354)."""
    for body in bodies if lo or hi is not None else ():
        fewest, most = length_range(body)
        lo = 0 if fewest >= lo else lo
        hi = None if hi is not None and most is not None and most <= hi else hi
    if lo or hi is not None:
        length = ra.repeat(ra.Chars(((0, ra.MAX_CODE_POINT),)), lo, hi)  # characters, as the bodies read them
        bodies = [*bodies, length]
    if len(bodies) == 1:
        return quoted(bodies[0])
    return quoted(compiled_or_nothing(intersection(bodies)))


def compiled_or_nothing(dfa: CharDfa) -> ra.Node:
    return ra.Compiled(dfa) if dfa.accept.max() >= 0 else ra.NOTHING


def const_text(value: object) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


# ---- numbers ------------------------------------------------------------------------------------
Bound = tuple[Decimal, bool]  # (value, exclusive)


def as_decimal(value: int | float) -> Decimal:
    """The decimal the schema wrote: a float's shortest repr, so 0.01 is exactly 0.01."""
    return Decimal(value) if isinstance(value, int) else Decimal(repr(value))


def integer_node(lo: int | None, hi: int | None) -> ra.Node:
    parts = []
    if lo is None or lo < 0:  # negatives: "-" and a magnitude >= 1
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        parts.append(ra.seq(ra.literal("-"), natural_range(mag_lo, None if lo is None else -lo)))
    if hi is None or hi >= 0:
        parts.append(natural_range(max(lo or 0, 0), hi))
    return ra.alt(*parts)


def number_node(lo: int | Decimal | Bound | None, hi: int | Decimal | Bound | None) -> ra.Node:
    """JSON numbers in [lo, hi] (a bound is a number, inclusive, or a (Decimal, exclusive) pair), exactly;
    bounded ones are written without exponent."""
    low, high = _as_bound(lo), _as_bound(hi)
    if low is None and high is None:
        exp = ra.optional(ra.seq(ra.char_class("eE"), ra.optional(ra.char_class("+-")),
                                 ra.repeat(DIGIT, 1, JSON_MAX_EXPONENT_DIGITS)))
        return ra.seq(ra.optional(ra.literal("-")), natural_range(0, None), _fraction_any(), exp)
    parts = []
    if low is None or low[0] < 0 or (low[0] == 0 and not low[1]):  # "-" and a magnitude
        neg_lo = (Decimal(0), False) if high is None or high[0] > 0 or (high[0] == 0 and not high[1]) \
            else (-high[0], high[1])
        neg_hi = None if low is None else (-low[0], low[1])
        parts.append(ra.seq(ra.literal("-"), magnitude_range(neg_lo, neg_hi)))
    if high is None or high[0] >= 0:
        pos_lo = (Decimal(0), False) if low is None or low[0] < 0 else low
        parts.append(magnitude_range(pos_lo, high))
    return ra.alt(*parts)


def _as_bound(bound: int | Decimal | Bound | None) -> Bound | None:
    if bound is None or isinstance(bound, tuple):
        return bound
    return (Decimal(bound), False)


def magnitude_range(lo: Bound, hi: Bound | None) -> ra.Node:
    """Non-negative decimals m (digits, optional fraction) with lo <= m <= hi (or < where exclusive)."""
    cap = Decimal(10) ** JSON_MAX_INT_DIGITS
    if hi is not None and hi[0] >= cap:
        hi = None  # beyond the longest integer part written: no bound in practice
    if lo[0] >= cap or (hi is not None and (hi[0] < lo[0] or (hi[0] == lo[0] and (lo[1] or hi[1])))):
        return ra.NOTHING
    a, fa = _split(lo[0])
    low_frac = _fraction(fa, ">" if lo[1] else ">=")
    if hi is None:
        return ra.alt(ra.seq(ra.literal(str(a)), low_frac), ra.seq(natural_range(a + 1, None), _fraction_any()))
    b, fb = _split(hi[0])
    high_frac = _fraction(fb, "<" if hi[1] else "<=")
    if a == b:
        return ra.seq(ra.literal(str(a)), compiled_or_nothing(intersection([low_frac, high_frac])))
    return ra.alt(ra.seq(ra.literal(str(a)), low_frac), ra.seq(natural_range(a + 1, b - 1), _fraction_any()),
                  ra.seq(ra.literal(str(b)), high_frac))


def _split(value: Decimal) -> tuple[int, str]:
    """(integer part, fraction digits without trailing zeros) of a non-negative decimal."""
    whole = int(value)
    digits = format(value - whole, "f").partition(".")[2].rstrip("0")
    return whole, digits


def _fraction_any() -> ra.Node:
    return ra.optional(ra.seq(ra.literal("."), ra.repeat(DIGIT, 1, JSON_MAX_FRACTION_DIGITS)))


def _fraction(digits: str, op: str) -> ra.Node:
    """Optional '.ddd' parts whose value 0.ddd compares to 0.`digits` by `op` (exactly, digit by digit)."""
    empty_ok = _compare_exhausted(digits, op)
    body = _fraction_digits(digits, op, JSON_MAX_FRACTION_DIGITS, first=True)
    return ra.alt(ra.EMPTY, ra.seq(ra.literal("."), body)) if empty_ok else ra.seq(ra.literal("."), body)


def _compare_exhausted(digits: str, op: str) -> bool:
    """Whether a fraction that stops here (the rest zeros) satisfies op against the rest `digits`."""
    zero = not digits  # digits carry no trailing zeros, so non-empty means above zero
    return {">=": zero, ">": False, "<=": True, "<": not zero}[op]


def _fraction_digits(digits: str, op: str, budget: int, first: bool) -> ra.Node:
    """Digit strings (1..budget long when `first`, else 0..budget) comparing to `digits` by op."""
    lo_len = 1 if first else 0
    parts: list[ra.Node] = [] if first or not _compare_exhausted(digits, op) else [ra.EMPTY]
    if budget == 0:
        return ra.alt(*parts)
    if not digits:  # the bound's rest is zero
        if op == ">=":
            return ra.repeat(DIGIT, lo_len, budget)
        if op == "<=":
            return ra.repeat(ra.literal("0"), lo_len, budget)
        if op == "<":
            return ra.alt(*parts)
        return ra.alt(*(ra.seq(ra.repeat(ra.literal("0"), zeros, zeros), ra.char_class("1-9"),
                               ra.repeat(DIGIT, 0, budget - 1 - zeros)) for zeros in range(budget)))
    d = int(digits[0])
    above = d < 9 and op in (">", ">=")
    below = d > 0 and op in ("<", "<=")
    if above:
        parts.append(ra.seq(ra.char_class(f"{d + 1}-9"), ra.repeat(DIGIT, 0, budget - 1)))
    if below:
        parts.append(ra.seq(ra.char_class(f"0-{d - 1}"), ra.repeat(DIGIT, 0, budget - 1)))
    parts.append(ra.seq(ra.literal(digits[0]), _fraction_digits(digits[1:], op, budget - 1, first=False)))
    return ra.alt(*parts)


def natural_range(lo: int, hi: int | None) -> ra.Node:
    """Decimal naturals in [lo, hi] without leading zeros; hi=None caps the length instead."""
    if hi is None:
        width = len(str(lo))
        top = 10 ** width - 1
        longer = ra.seq(ra.char_class("1-9"), ra.repeat(DIGIT, width, JSON_MAX_INT_DIGITS - 1)) \
            if width < JSON_MAX_INT_DIGITS else ra.NOTHING
        return ra.alt(natural_range(lo, top), longer)
    if hi < lo:
        return ra.NOTHING
    parts = []
    for width in range(len(str(lo)), len(str(hi)) + 1):
        a = max(lo, 10 ** (width - 1) if width > 1 else 0)
        b = min(hi, 10 ** width - 1)
        parts.append(_same_width(str(a), str(b)))
    return ra.alt(*parts)


def _same_width(lo: str, hi: str) -> ra.Node:
    if not lo:
        return ra.EMPTY
    if lo == "0" * len(lo) and hi == "9" * len(hi):  # any digits: keeps the recursion linear in the width
        return ra.repeat(DIGIT, len(lo), len(lo))
    if lo[0] == hi[0]:
        return ra.seq(ra.literal(lo[0]), _same_width(lo[1:], hi[1:]))
    k = len(lo) - 1
    parts = [ra.seq(ra.literal(lo[0]), _same_width(lo[1:], "9" * k))]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(ra.seq(ra.char_class(f"{int(lo[0]) + 1}-{int(hi[0]) - 1}"), ra.repeat(DIGIT, k, k)))
    parts.append(ra.seq(ra.literal(hi[0]), _same_width("0" * k, hi[1:])))
    return ra.alt(*parts)


def multiples_of(k: int) -> ra.Node:
    """Integers (optional '-', digits) divisible by k: a DFA over the remainder so far, k states."""
    digit_sets = [((ord(str(d)), ord(str(d))),) for d in range(10)] + [((ord("-"), ord("-")),)]
    alphabet = alphabet_of(digit_sets)
    cls = [alphabet.members[s][0] for s in digit_sets]
    start, sign = k, k + 1  # states 0..k-1: remainder after at least one digit
    trans = np.full((k + 2, len(alphabet.classes)), -1, np.int64)
    for r in range(k):
        for d in range(10):
            trans[r, cls[d]] = (r * 10 + d) % k
    for src in (start, sign):
        for d in range(10):
            trans[src, cls[d]] = d % k
    trans[start, cls[10]] = sign
    accept = np.full(k + 2, -1, np.int64)
    accept[0] = 0
    order = [start, sign, *range(k)]  # the start state must be state 0
    remap = np.argsort(order)
    trans = np.where(trans[order] >= 0, remap[np.maximum(trans[order], 0)], -1)
    return ra.Compiled(CharDfa(trans, accept[order], alphabet))
