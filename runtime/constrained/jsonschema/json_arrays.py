"""JSON arrays: prefixItems (draft 4-7 tuple items), then items, within minItems / maxItems; and
uniqueItems, enforced exactly where the items have few possible values."""
from __future__ import annotations

from ..regex import regex_ast as ra
from .contract import SchemaCompiler
from .json_scalars import const_text
from .json_types import KNOWN_FORMATS, as_types, count_keyword, json_type
from .schema_merge import JSON_TYPES, Unsatisfiable, normalize

MAX_UNIQUE_VALUES = 8  # uniqueItems is enforced over at most this many item values (2^n states)


def _joined(items: list[ra.Node], comma: ra.Node) -> ra.Node:
    return ra.seq(*(ra.seq(comma, x) if i else x for i, x in enumerate(items)))


def _finite_values(items: object) -> list | None:
    """The values an items schema allows when it is a plain enum, const or boolean, else None."""
    if not isinstance(items, dict):
        return None
    s = normalize(items, KNOWN_FORMATS)
    types = as_types(s.pop("type", list(JSON_TYPES)))
    if not s and types == {"boolean"}:
        return [True, False]
    if set(s) - {"enum", "const"}:
        return None
    if not s:
        return None
    values = [s["const"]] if "const" in s else s["enum"]
    if "const" in s and "enum" in s:
        values = [v for v in values if v in s["enum"]]
    return [v for v in values if json_type(v) in types or (json_type(v) == "integer" and "number" in types)]


def _canonical(value: object) -> object:
    """One spelling per JSON value (1.0 and 1 are equal, so they must not both appear as unique items)."""
    return int(value) if isinstance(value, float) and value == int(value) else value


def array_node(c: SchemaCompiler, s: dict, path: str) -> ra.Node:
    lo, hi = count_keyword(s, "minItems", 0, path), count_keyword(s, "maxItems", None, path)
    if hi is not None and hi < lo:
        raise Unsatisfiable(f"maxItems {hi} is below minItems {lo} at {path}")
    if s.get("uniqueItems", False) and (hi is None or hi > 1):
        values = _finite_values(s.get("items", True))
        if (values is not None and len(values) <= MAX_UNIQUE_VALUES) or "uniqueItems" not in c.relaxed:
            return _unique_array(c, s, lo, hi, path)
        c.unenforced.append(f"uniqueItems at {path}")
    prefix_schemas = s.get("prefixItems", [])
    if not isinstance(prefix_schemas, list):
        raise ValueError(f"json_schema prefixItems at {path} must be a list")
    prefix: list[ra.Node] = []
    for i, sub in enumerate(prefix_schemas):
        try:
            prefix.append(c.compile(sub, f"{path}/prefixItems/{i}"))
        except Unsatisfiable:
            break  # arrays end before an item that nothing satisfies
    items = s.get("items", s.get("unevaluatedItems", True))
    rest = None
    if items is not False and len(prefix) == len(prefix_schemas) and (hi is None or hi > len(prefix)):
        try:
            rest = c.compile(items, f"{path}/items")
        except Unsatisfiable:
            rest = None
    comma = c.separator(any(ra.refs(n) for n in prefix) or (rest is not None and bool(ra.refs(rest))))
    top = len(prefix) if hi is None else min(len(prefix), hi)
    options = [_joined(prefix[:n], comma) for n in range(lo, top + 1)]
    if rest is not None:
        more_lo, more_hi = max(lo - len(prefix), 1), None if hi is None else hi - len(prefix)
        if prefix:
            options.append(ra.seq(_joined(prefix, comma), ra.repeat(ra.seq(comma, rest), more_lo, more_hi)))
        else:
            options.append(ra.seq(rest, ra.repeat(ra.seq(comma, rest), more_lo - 1,
                                                  None if more_hi is None else more_hi - 1)))
    if not options:
        raise Unsatisfiable(f"no array length satisfies minItems/maxItems/prefixItems at {path}")
    return c.bracketed("[", ra.alt(*options), "]")


def _unique_array(c: SchemaCompiler, s: dict, lo: int, hi: int | None, path: str) -> ra.Node:
    """uniqueItems over a finite set of item values (an enum, booleans): an automaton over the
    set of values used so far. Other item schemas cannot be enforced, and are refused."""
    values = _finite_values(s.get("items", True)) if not s.get("prefixItems") else None
    if values is None or len(values) > MAX_UNIQUE_VALUES:
        raise ValueError(f"json_schema keyword 'uniqueItems' at {path} is supported only for items with at "
                         f"most {MAX_UNIQUE_VALUES} possible values (an enum, const or boolean), or maxItems <= 1; "
                         "relax it explicitly (relaxed=['uniqueItems']) to generate without it")
    comma = c.separator(False)
    texts = list(dict.fromkeys(const_text(_canonical(v)) for v in values))
    edges = [(used, ra.seq(comma if used else ra.EMPTY, ra.literal(text)), used | 1 << i)
             for used in range(1 << len(texts)) for i, text in enumerate(texts) if not used >> i & 1]
    finals = tuple(used for used in range(1 << len(texts))
                   if lo <= used.bit_count() and (hi is None or used.bit_count() <= hi))
    if not finals:
        raise Unsatisfiable(f"no array of distinct items at {path} has between minItems and maxItems items")
    body = ra.Graph(1 << len(texts), tuple(edges), finals)
    return c.bracketed("[", body, "]")
