"""`not` in its common forms: not a type, not some values, not a pattern, not some required
properties; each an exact complement within what the rest of the schema allows."""
from __future__ import annotations

from typing import Iterable

from ..regex import regex_ast as ra
from ..regex.automaton import difference, intersection
from .contract import SchemaCompiler
from .json_combinators import matches_every_value, merged_all_of
from .json_scalars import STRING_CHARS, compiled_or_nothing, const_text, pattern_body, quoted, spellings
from .json_types import KNOWN_FORMATS, as_types, json_type
from .schema_merge import JSON_TYPES, Unsatisfiable, conjoin_sub, normalize


def negated(c: SchemaCompiler, s: dict, path: str) -> ra.Node:
    """`not` in its common forms: not a type, not some values, not some required properties."""
    rest = {k: v for k, v in s.items() if k != "not"}
    neg = s["not"]
    if neg is False:
        return c.compile(rest or True, path)
    if neg is True or not isinstance(neg, dict):
        raise Unsatisfiable(f"`not` at {path} excludes every value")
    n = normalize(neg, KNOWN_FORMATS)
    if set(n) == {"$ref"}:  # a named schema: its target's shape decides
        key, target = c.refs.resolve(n["$ref"], path)
        return negated(c, {**rest, "not": target}, key)
    if not n:
        raise Unsatisfiable(f"`not` at {path} excludes every value")
    merged = merged_all_of(n)
    if merged is not None:  # not: {allOf: [{required: [a]}, {required: [b]}]}, as one schema
        return negated(c, {**rest, "not": merged}, path)
    keys = set(n)
    if keys == {"anyOf"} and isinstance(n["anyOf"], list) and n["anyOf"]:  # not (A or B) = not A and not B
        return _none_of(c, rest, n["anyOf"], path)
    if keys in ({"type", "enum"}, {"type", "const"}):  # only the values of its types are excluded
        drop = _excluded_types(n["type"])
        values = [v for v in (n["enum"] if "enum" in n else [n["const"]]) if json_type(v) in drop]
        return negated(c, {**rest, "not": {"enum": values}}, path) if values else c.compile(rest or True, path)
    types = as_types(rest.get("type", list(JSON_TYPES)))
    if keys == {"type"}:
        drop = _excluded_types(n["type"])
        if "integer" in drop and "number" in types and "number" not in drop:
            raise ValueError(f"json_schema not at {path}: `not: integer` beside number is not supported")
        left = [t for t in JSON_TYPES if t in types and t not in drop]
        if not left:
            raise Unsatisfiable(f"`not` at {path} excludes every type the schema allows")
        return c.compile({**rest, "type": left}, path)
    if keys <= {"enum", "const"}:
        values = [n["const"]] if "const" in n else []
        values += n.get("enum", [])
        return c.union([lambda t=t: _without(c, rest, t, values, path) for t in types if t != "integer"
                           or "number" not in types], path)
    if "pattern" in keys and keys <= {"pattern", "type"} and as_types(n.get("type", "string")) == {"string"}:
        makers = [lambda: _string_not_matching(c, rest, n["pattern"], path)] if "string" in types else []
        others = [t for t in types if t != "string"]
        if "type" in n and others:  # a `not` that names its type lets the other types through
            makers.append(lambda: c.compile({**rest, "type": others}, path))
        return c.union(makers, path)
    if keys <= {"required", "properties", "type"} and as_types(n.get("type", "object")) == {"object"}:
        branches = [{**rest, "type": [t for t in types if t != "object"]}] if "type" in n else []
        obj = conjoin_sub(rest, {"type": "object"})
        branches += [conjoin_sub(obj, {"properties": {r: False}}) for r in n.get("required", [])]
        branches += [conjoin_sub(obj, {"required": [p], "properties": {p: {"not": sub}}})
                     for p, sub in n.get("properties", {}).items()]
        return c.union([lambda b=b: c.compile(b, path) for b in branches if b.get("type", True) != []],
                          path)
    if keys == {"oneOf"} and isinstance(n["oneOf"], list):  # one branch every value matches: none of the others
        free = [i for i, b in enumerate(n["oneOf"]) if matches_every_value(c, b, path)]
        if len(free) == 1:
            others = [b for i, b in enumerate(n["oneOf"]) if i != free[0]]
            return c.compile(conjoin_sub(rest, {"anyOf": others}) if rest else {"anyOf": others}, path)
    if keys <= _ARRAY_NOT and as_types(n.get("type", "array")) == {"array"} and not isinstance(n.get("items"), list):
        return _not_array(c, rest, n, types, path)
    raise ValueError(f"json_schema not at {path}: only `not` with a type, enum/const, required/properties, or "
                     f"items/minItems/maxItems is supported, got keywords {sorted(keys)}")


_ARRAY_NOT = frozenset({"type", "items", "minItems", "maxItems"})
# what an array must say nothing of for "some item fails `items`" to be its items around one such item
_ARRAY_WORDS = frozenset({"prefixItems", "minItems", "maxItems", "uniqueItems", "contains", "additionalItems",
                          "unevaluatedItems", "minContains", "maxContains"})


def _not_array(c: SchemaCompiler, rest: dict, n: dict, types: set[str], path: str) -> ra.Node:
    """`rest` and not the array schema `n`: the other types where `n` names its type, arrays shorter than its
    minItems or longer than its maxItems, and arrays holding an item its `items` refuses."""
    makers = []
    if "type" in n and [t for t in types if t != "array"]:
        makers.append(lambda: c.compile({**rest, "type": [t for t in types if t != "array"]}, path))
    arr = conjoin_sub(rest, {"type": "array"})
    lo, hi = n.get("minItems", 0), n.get("maxItems")
    if isinstance(lo, int) and lo > 0:
        makers.append(lambda: _bounded(c, conjoin_sub(arr, {"maxItems": lo - 1}), path))
    if isinstance(hi, int):
        makers.append(lambda: _bounded(c, conjoin_sub(arr, {"minItems": hi + 1}), path))
    if n.get("items", True) is not True:
        makers.append(lambda: _array_holding(c, arr, {"not": n["items"]}, path))
    return c.union(makers, path)


def _bounded(c: SchemaCompiler, schema: object, path: str) -> ra.Node:
    """`schema`'s values whose unconstrained parts nest a few levels deep at most, as one regex: the array
    branches of a `not` stay regular, apart from rules (a union of array containers holding rules would
    merge their bodies)."""
    c.bounded_any += 1
    try:
        return c.exact(lambda: c.compile(schema, path))
    finally:
        c.bounded_any -= 1


def _array_holding(c: SchemaCompiler, arr: object, bad: dict, path: str) -> ra.Node:
    """The arrays of `arr` with at least one item matching `bad` (and its items): `[` items `,` the bad one
    `,` items `]`, a regular language where the items are; any value there nests at most a few levels
    deep (the undeclared values' bound): arrays holding deeper ones are left out, never let in."""
    if not isinstance(arr, dict) or _ARRAY_WORDS & arr.keys() or isinstance(arr.get("items"), list):
        raise ValueError(f"json_schema not at {path}: excluding arrays whose items fail a schema is supported only "
                         "for arrays the rest of the schema says nothing else of")
    items = arr.get("items", True)
    item = _bounded(c, items, path)
    odd = _bounded(c, bad if items is True else {"allOf": [items, bad]}, path)
    if ra.refs(item) or ra.refs(odd):
        raise ValueError(f"json_schema not at {path}: excluding arrays of recursive items is not supported")
    comma = c.separator(False)
    return c.bracketed("[", ra.seq(ra.repeat(ra.seq(item, comma), 0, None), odd,
                                   ra.repeat(ra.seq(comma, item), 0, None)), "]")


def _excluded_types(type_value: str | Iterable[str]) -> set[str]:
    """The types a `not: {type: ...}` excludes: every number is excluded with `number`, integers too."""
    drop = as_types(type_value)  # a fresh set
    return drop | {"integer"} if "number" in drop else drop


def _none_of(c: SchemaCompiler, rest: dict, branches: list, path: str) -> ra.Node:
    """`rest` and none of the branches: a branch that is a type or requires one property narrows `rest`
    (the other types; that property forbidden); any others as copies of `rest` each without one
    branch, conjoined."""
    others = []
    for branch in branches:
        narrowed = _complement_as_schema(normalize(branch, KNOWN_FORMATS) if isinstance(branch, dict) else branch)
        if narrowed is None:
            others.append(branch)
        else:
            rest = conjoin_sub(rest, narrowed)
    if len(others) <= 1:
        return negated(c, {**rest, "not": others[0]}, path) if others else c.compile(rest or True, path)
    return c.compile({"allOf": [{**rest, "not": b} for b in others]}, path)


def _complement_as_schema(n: object) -> dict | None:
    """A schema for the values `n` refuses, where `n` is one type or requires one property; else None."""
    if not isinstance(n, dict):
        return None
    if set(n) == {"required"} and isinstance(n["required"], list) and len(n["required"]) == 1:
        return {"properties": {n["required"][0]: False}}
    if set(n) == {"type"}:
        drop = _excluded_types(n["type"])
        if "integer" in drop and "number" not in drop:
            return None  # the non-integer numbers are no type of their own
        return {"type": [t for t in JSON_TYPES if t not in drop]}
    return None


def _string_not_matching(c: SchemaCompiler, rest: dict, pattern: object, path: str) -> ra.Node:
    """The schema's strings that no match of `pattern` occurs in. Written with raw characters only,
    as a pattern reads them (an escaped spelling of a matching string must not slip through)."""
    node = c.exact(lambda: c.compile({**rest, "type": "string"}, path))
    if ra.refs(node):
        raise ValueError(f"json_schema not at {path}: excluding a pattern from a recursive schema is not supported")
    raw = compiled_or_nothing(intersection([node, quoted(ra.repeat(ra.Chars(STRING_CHARS), 0, None))]))
    out = compiled_or_nothing(difference(raw, quoted(pattern_body(pattern, path))))
    if out == ra.NOTHING:
        raise Unsatisfiable(f"`not` at {path} excludes every string")
    return out


def _without(c: SchemaCompiler, rest: dict, t: str, values: list, path: str) -> ra.Node:
    node = c.exact(lambda: c.compile({**rest, "type": t}, path))
    drop = [quoted(spellings(v)) for v in values if t == "string" and isinstance(v, str)]
    drop += [ra.literal(const_text(v)) for v in values if t in ("boolean", "null") and json_type(v) == t]
    numbers = [v for v in values if json_type(v) in ("integer", "number")]
    if t == "integer":
        drop += [ra.literal(str(int(v))) for v in numbers if v == int(v)]
    elif t == "number" and numbers:
        raise ValueError(f"json_schema not at {path}: excluding numbers from a `number` is not supported")
    if t in ("object", "array") and any(json_type(v) == t for v in values):
        raise ValueError(f"json_schema not at {path}: excluding {t} values is not supported")
    if not drop:
        return node
    if ra.refs(node):
        raise ValueError(f"json_schema not at {path}: excluding values from a recursive schema is not supported")
    out = compiled_or_nothing(difference(node, ra.alt(*drop)))
    if out == ra.NOTHING:
        raise Unsatisfiable(f"`not` at {path} excludes every {t}")
    return out
