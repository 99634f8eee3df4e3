"""JSON Schema keywords: which ones constrain values, normalizing drafts 4 to 2020-12, and the
conjunction of two schemas (allOf, `$ref` with siblings, a keyword beside a combinator).

A keyword that is not a validation keyword of any draft is an annotation (title, description, id,
vendor x-* keys, ...): the specification tells a validator to ignore it, and so do we.
"""
from __future__ import annotations

import math
import re
from typing import Any, Iterable

from ..json_equality import same_json

# Keywords that constrain values, in some draft. Anything else is an annotation.
VALIDATION = frozenset({
    "type", "enum", "const", "multipleOf", "maximum", "exclusiveMaximum", "minimum", "exclusiveMinimum",
    "maxLength", "minLength", "pattern", "format", "items", "additionalItems", "prefixItems", "maxItems",
    "minItems", "uniqueItems", "contains", "maxContains", "minContains", "maxProperties", "minProperties",
    "required", "properties", "patternProperties", "additionalProperties", "dependencies", "dependentRequired",
    "dependentSchemas", "propertyNames", "unevaluatedItems", "unevaluatedProperties", "allOf", "anyOf", "oneOf",
    "not", "if", "then", "else", "$ref", "$dynamicRef", "$recursiveRef",
})
JSON_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
_LOWER = {"minimum", "exclusiveMinimum", "minLength", "minItems", "minProperties", "minContains"}
_UPPER = {"maximum", "exclusiveMaximum", "maxLength", "maxItems", "maxProperties", "maxContains"}
MAX_BRANCHES = 64  # anyOf/oneOf branches a conjunction may multiply out to


class Clash(Exception):
    """Two schemas whose conjunction has no keyword-wise form (the caller intersects their languages)."""


class Unsatisfiable(ValueError):
    """No value satisfies the schema (a branch of anyOf that can be dropped)."""


def normalize(schema: dict, known_formats: frozenset[str]) -> dict:
    """The schema's validation keywords only, in one draft's spelling: draft-4 boolean exclusive bounds
    become numbers, tuple `items` become `prefixItems`, `dependencies` split into `dependentRequired` /
    `dependentSchemas`, and unknown formats (annotations since 2019-09) are dropped."""
    out = {k: v for k, v in schema.items() if k in VALIDATION}
    for key, exclusive in (("minimum", "exclusiveMinimum"), ("maximum", "exclusiveMaximum")):
        if isinstance(out.get(exclusive), bool):
            if out.pop(exclusive) and key in out:
                out[exclusive] = out.pop(key)
    if isinstance(out.get("items"), list):
        out["prefixItems"] = out.pop("items")
        if "additionalItems" in out:
            out["items"] = out.pop("additionalItems")
    out.pop("additionalItems", None)  # without tuple items it constrains nothing
    if "if" not in out or ("then" not in out and "else" not in out):  # then/else decide; `if` alone does not
        for key in ("if", "then", "else"):
            out.pop(key, None)
    deps = out.pop("dependencies", None)
    if isinstance(deps, dict):
        for name, dep in deps.items():
            key = "dependentRequired" if isinstance(dep, list) else "dependentSchemas"
            out.setdefault(key, {})[name] = dep
    if isinstance(out.get("format"), str) and out["format"] not in known_formats:
        del out["format"]
    return out


# a, b and the result: subschemas, any JSON value (a dict or bool when valid; the compiler rejects others)
def conjoin(a: Any, b: Any) -> Any:  # noqa: ANN401 - subschemas (above)
    """A schema equivalent to `a` and `b` both holding, keyword by keyword; raises Clash where a
    keyword pair has no such form. Both are normalized and hold no `$ref` or `allOf` at the top."""
    if a is True or a == {}:
        return b
    if b is True or b == {}:
        return a
    if a is False or b is False:
        return False
    out = dict(a)
    for key, value in b.items():
        if key not in out or same_json(out[key], value):  # not ==: Python's True == 1
            out[key] = value
        else:
            out[key] = _combine(key, out[key], value, a, b)
    if "properties" in a or "properties" in b or "patternProperties" in a or "patternProperties" in b:
        _merge_property_sets(out, a, b)
    return out


def conjoin_all(parts: Iterable[Any]) -> object:
    """`conjoin` over parts, in order (True for none); raises Clash where two do not merge."""
    merged: Any = True
    for part in parts:
        merged = conjoin(merged, part)
    return merged


# a, b and the result: subschemas, any JSON value (a dict or bool when valid; the compiler rejects others)
def conjoin_sub(a: Any, b: Any) -> Any:  # noqa: ANN401 - subschemas (above)
    """`conjoin` for a subschema position: where it clashes, an allOf that the compiler intersects."""
    if not isinstance(a, dict) or not isinstance(b, dict) or "$ref" in a or "$ref" in b \
            or "allOf" in a or "allOf" in b:
        return conjoin(a, b) if isinstance(a, bool) or isinstance(b, bool) else {"allOf": [a, b]}
    try:
        return conjoin(a, b)
    except Clash:
        return {"allOf": [a, b]}


# x, y and the result: values of the keyword `key`, of the JSON type it takes (a number, list, dict, schema...)
def _combine(key: str, x: Any, y: Any, a: dict, b: dict) -> Any:  # noqa: ANN401 - `key`'s values (above)
    if key == "type":
        return _types(x, y)
    if key in _LOWER:
        return max(x, y)
    if key in _UPPER:
        return min(x, y)
    if key == "enum":
        keep = [v for v in x if any(same_json(v, w) for w in y)]
        if not keep:
            raise Unsatisfiable("enum values of allOf branches do not intersect")
        return keep
    if key == "const":
        raise Unsatisfiable("const values of allOf branches differ")
    if key == "required":
        return list(dict.fromkeys([*x, *y]))
    if key == "uniqueItems":
        return x or y
    if key == "multipleOf" and _is_int(x) and _is_int(y):
        return x * y // math.gcd(x, y)
    if key == "pattern":
        return (*_as_tuple(x), *_as_tuple(y))  # a tuple: every pattern must match
    if key in ("properties", "dependentSchemas"):
        return {**x, **y, **{k: conjoin_sub(x[k], y[k]) for k in x.keys() & y.keys()}}
    if key == "dependentRequired":
        return {**x, **y, **{k: list(dict.fromkeys([*x[k], *y[k]])) for k in x.keys() & y.keys()}}
    if key in ("items", "additionalProperties", "propertyNames", "contains"):
        return conjoin_sub(x, y)
    if key == "prefixItems":
        n = max(len(x), len(y))
        return [conjoin_sub(_item(x, a, i), _item(y, b, i)) for i in range(n)]
    if key in ("anyOf", "oneOf") and isinstance(x, list) and isinstance(y, list):
        if len(x) * len(y) <= MAX_BRANCHES:
            pairs = [(p, q) for p in x for q in y]  # exactly one pair holds iff one of each does
        else:
            pairs = [(p, {key: y}) for p in x]  # too many pairs: the other choice inside each branch
        return _satisfiable_branches(pairs)
    raise Clash(key)


def _satisfiable_branches(pairs: list[tuple[Any, Any]]) -> list:
    """The pairs' conjunctions that some value can satisfy: a pair of branches with no common type (a string
    branch against a null one) holds for no value, so it drops out rather than making the whole conjunction
    unsatisfiable (`{"oneOf": [string, object]}` and `{"oneOf": [string, null]}` is a string); none left: none."""
    branches = []
    for p, q in pairs:
        try:
            branches.append(conjoin_sub(p, q))
        except Unsatisfiable:
            continue
    if not branches:
        raise Unsatisfiable("no branch of one choice satisfies a branch of the other")
    return branches


def _types(x: object, y: object) -> list[str]:
    xs, ys = _as_list(x), _as_list(y)
    out = [t for t in xs if t in ys]
    out += [t for t in ("integer",) if t not in out and (("integer" in xs and "number" in ys)
                                                         or ("number" in xs and "integer" in ys))]
    if not out:
        raise Unsatisfiable(f"allOf branches allow no common type ({x!r} and {y!r})")
    return out


def _merge_property_sets(out: dict, a: dict, b: dict) -> None:
    """Each side allows a property only as its `properties`, `patternProperties` or
    `additionalProperties` say: a declared name gets every side's schema for it."""
    props = {}
    for name in dict.fromkeys([*a.get("properties", {}), *b.get("properties", {})]):
        props[name] = conjoin_sub(property_schema(a, name), property_schema(b, name))
    out["properties"] = props
    pa, pb = a.get("patternProperties"), b.get("patternProperties")
    if pa and pb and pa != pb:
        raise Clash("patternProperties")
    for side, other in ((a, b), (b, a)):
        if side.get("patternProperties") and other.get("additionalProperties", True) is not True:
            raise Clash("patternProperties")
    extra_a, extra_b = a.get("additionalProperties", True), b.get("additionalProperties", True)
    if "additionalProperties" in a or "additionalProperties" in b:
        out["additionalProperties"] = conjoin_sub(extra_a, extra_b)


def property_schema(schema: dict, name: str) -> object:
    """The schema that `schema` applies to a property `name` (True where it says nothing)."""
    props = schema.get("properties", {})
    if name in props:
        return props[name]
    matching = [sub for pattern, sub in schema.get("patternProperties", {}).items() if _search(pattern, name)]
    if matching:
        out = matching[0]
        for sub in matching[1:]:
            out = conjoin_sub(out, sub)
        return out
    return schema.get("additionalProperties", True)


def _search(pattern: str, name: str) -> bool:
    try:
        return re.search(pattern, name) is not None
    except (re.error, TypeError) as e:
        raise ValueError(f"json_schema patternProperties pattern {pattern!r} is not a valid regex: {e}") from None


def _item(prefix: list, schema: dict, i: int) -> object:
    return prefix[i] if i < len(prefix) else schema.get("items", True)


def _is_int(x: object) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x > 0


def _as_list(x: object) -> list:
    return list(x) if isinstance(x, list) else [x]


def _as_tuple(x: object) -> tuple:
    return x if isinstance(x, tuple) else (x,)
