"""String and number schemas -> nodes: lengths, patterns and formats; exact decimal bounds and
multipleOf. Strings too long for one lexeme are read in chunks (grammar mode only)."""
from __future__ import annotations

import math
from decimal import Decimal

from ...config import MAX_DFA_TRANSITIONS
from ..regex import regex_ast as ra
from ..regex.automaton import compile_dfa, intersection
from ..regex.regex_parser import parse_regex
from .contract import SchemaCompiler
from .json_scalars import (
    FORMATS,
    as_decimal,
    compiled_or_nothing,
    constrained_string,
    integer_node,
    multiples_of,
    number_node,
    pattern_body,
    quoted,
    string_body,
    string_node,
)
from .json_types import count_keyword
from .schema_merge import Unsatisfiable

STRING_CHUNK = 512  # in grammar mode, a string longer than twice this many characters is read in chunks of it
LONG_PATTERNED = 256  # a string with a pattern or format and a maxLength above this is sized before it is built


def _bound(schema: dict, key: str, exclusive_key: str, path: str) -> tuple[Decimal, bool] | None:
    """(bound, exclusive): the tighter of the inclusive and exclusive keywords, as exact decimals."""
    value, excl = schema.get(key), schema.get(exclusive_key)
    for k, v in ((key, value), (exclusive_key, excl)):
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v)):
            raise ValueError(f"json_schema {k} at {path} must be a finite number, got {v!r}")
    inclusive = None if value is None else (as_decimal(value), False)
    exclusive = None if excl is None else (as_decimal(excl), True)
    if inclusive is None or exclusive is None:
        return inclusive or exclusive
    tighter = exclusive[0] >= inclusive[0] if key == "minimum" else exclusive[0] <= inclusive[0]
    return exclusive if tighter else inclusive


def _int_bounds(lo, hi, path: str) -> tuple[int | None, int | None]:
    low = None if lo is None else (math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0]))
    high = None if hi is None else (math.ceil(hi[0]) - 1 if hi[1] else math.floor(hi[0]))
    if low is not None and high is not None and low > high:
        raise Unsatisfiable(f"no integer lies in [{low}, {high}] at {path}")
    return low, high


def string_schema(c: SchemaCompiler, s: dict, path: str) -> ra.Node:
    lo, hi = count_keyword(s, "minLength", 0, path), count_keyword(s, "maxLength", None, path)
    if hi is not None and hi < lo:
        raise Unsatisfiable(f"maxLength {hi} is below minLength {lo} at {path}")
    bodies = [FORMATS[s["format"]]] if "format" in s else []
    patterns = s.get("pattern", ())
    bodies += [pattern_body(p, path) for p in (patterns if isinstance(patterns, tuple) else (patterns,))]
    if bodies and hi is not None and hi > LONG_PATTERNED and _too_large(bodies, hi):
        c.unenforced.append(f"maxLength at {path} (with its pattern, too large an automaton: not enforced)")
        hi = None
    if not bodies:
        return long_string(c, lo, hi) if c.rule_size is not None and hi is not None and hi > 2 * STRING_CHUNK \
            else string_node(lo, hi)
    node = constrained_string(bodies, lo, hi)
    if node == ra.NOTHING or node == quoted(ra.NOTHING):
        raise Unsatisfiable(f"no string at {path} satisfies its pattern, format and length together")
    return node


def _too_large(bodies: list[ra.Node], hi: int) -> bool:
    """Whether strings of at most `hi` characters matching `bodies` make a byte DFA past half the bound: its
    states grow linearly with the length (a count per place in the pattern, times the UTF-8 steps of its
    classes), so two small lengths foretell it (a Unicode \\w over 1,024 characters: ~320,000 states)."""
    small, large = (compile_dfa([constrained_string(bodies, 0, n)]) for n in (8, 16))
    per_char = (large.trans.shape[0] - small.trans.shape[0]) / 8
    return (large.trans.shape[0] + per_char * (hi - 16)) * large.trans.shape[1] > MAX_DFA_TRANSITIONS / 2


def long_string(c: SchemaCompiler, lo: int, hi: int) -> ra.Node:
    """A string of lo..hi characters, as chunks of exactly STRING_CHUNK characters then a last piece
    that closes the quote: one lexeme of thousands of counted characters would be a DFA too large
    to build. Longest-match lexing reads a chunk only where the string goes on past it."""
    c.rules.setdefault("string_chunk", string_body(STRING_CHUNK, STRING_CHUNK))
    tail: ra.Node = ra.NOTHING
    for j in reversed(range(hi // STRING_CHUNK + 1)):  # rule j: the rest after j chunks
        last_lo, last_hi = max(0, lo - j * STRING_CHUNK), min(STRING_CHUNK, hi - j * STRING_CHUNK)
        last = ra.seq(string_body(last_lo, last_hi), ra.literal('"')) if last_lo <= last_hi else ra.NOTHING
        more = ra.seq(ra.Ref("string_chunk"), tail) if tail != ra.NOTHING else ra.NOTHING
        name = f"string_{lo}_{hi}_{j}"
        c.rules[name] = ra.alt(last, more)
        tail = ra.Ref(name)
    return ra.seq(ra.literal('"'), tail)


def number_schema(c: SchemaCompiler, t: str, s: dict, path: str) -> ra.Node:
    lo, hi = _bound(s, "minimum", "exclusiveMinimum", path), _bound(s, "maximum", "exclusiveMaximum", path)
    step = s.get("multipleOf")
    if step is not None and (not isinstance(step, int | float) or isinstance(step, bool) or step <= 0):
        raise ValueError(f"json_schema multipleOf at {path} must be a positive number, got {step!r}")
    if step is not None:
        return _multiples(c, t, as_decimal(step), lo, hi, path)
    if t == "integer":
        return integer_node(*_int_bounds(lo, hi, path))
    node = number_node(lo, hi)
    if node == ra.NOTHING:
        raise Unsatisfiable(f"no number lies within the bounds at {path}")
    return node


def _multiples(c: SchemaCompiler, t: str, step: Decimal, lo, hi, path: str) -> ra.Node:
    """Integers that are multiples of `step`; for `number`, decimals with a step of 10^-d."""
    num, den = step.as_integer_ratio()
    if t == "number" and num == 1 and den > 1 and 10 ** (len(str(den)) - 1) == den:
        digits = len(str(den)) - 1
        fits = parse_regex(rf"-?[0-9]+(?:\.[0-9]{{1,{digits}}})?")
        out = compiled_or_nothing(intersection([number_node(lo, hi), fits]))
    else:
        # an integer n is a multiple of num/den iff n is a multiple of num / gcd(num, den)
        if t == "number" and den != 1:
            raise ValueError(f"json_schema multipleOf {step} at {path} on a number is not supported "
                             "(integers, or steps like 0.01, are)")
        k = num // math.gcd(num, den)
        a, b = _int_bounds(lo, hi, path)
        out = integer_node(a, b) if k == 1 else compiled_or_nothing(intersection([integer_node(a, b), multiples_of(k)]))
    if out == ra.NOTHING:
        raise Unsatisfiable(f"no multiple of {step} lies within the bounds at {path}")
    return out
