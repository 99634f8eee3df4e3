"""A schema-level proof that two `oneOf` branches share no value: both accept objects only (by their
`type`, or the type their keywords imply, as the compiler infers it), and both require a property (a
discriminator, as in tagged unions) whose const/enum values do not overlap, or one requires a property
that the other forbids or allows other const/enum values for (by name, or through `additionalProperties`).
A property every `anyOf`/`oneOf` branch requires is required, with the union of the branches' values.
Or both accept non-empty arrays only, whose first items' types do not overlap. Or, in strict mode, for
the values the compiler emits: each requires a property that the other's strict objects never write
(they write declared properties only), so no value that one branch emits satisfies the other.

Or each branch lists its values (const/enum) and no value is in both lists.

Sound, not complete: every keyword read is a conjunct of the branch (top-level keywords, `allOf`
members, plain `$ref` targets), so each only narrows what the branch accepts; anything else is
ignored, which can only make the proof fail.
"""
from __future__ import annotations

from typing import Any, Callable, Hashable

from ..json_equality import json_key
from .json_types import as_types
from .schema_merge import normalize

_MAX_DEPTH = 8  # $ref / allOf hops followed, at most
_MAX_EXPANSIONS = 256  # anyOf/oneOf branches read, at most, per pair of branches
# keywords that send a schema down another compile path than its own (implied) type: no inference then
_NOT_DIRECT = frozenset({"type", "$ref", "allOf", "anyOf", "oneOf", "not", "if", "enum", "const",
                         "dependentRequired", "dependentSchemas"})
_ADDS_PROPERTIES = frozenset({"anyOf", "oneOf", "if", "then", "else", "not", "dependentSchemas", "patternProperties"})


def provably_disjoint(a: object, b: object, resolve: Callable[[str], Any], formats: frozenset[str],
                      infer_type: Callable[[dict], str | None], strict: bool = False) -> bool:
    parts_a, parts_b = _conjuncts(a, resolve, formats, 0), _conjuncts(b, resolve, formats, 0)
    values_a, values_b = _own_values(parts_a), _own_values(parts_b)
    if values_a is not None and values_b is not None and not values_a & values_b:
        return True
    item_types_a, item_types_b = _first_item_types(parts_a, formats), _first_item_types(parts_b, formats)
    if item_types_a is not None and item_types_b is not None and not item_types_a & item_types_b:
        return True
    if not (_objects_only(parts_a, infer_type) and _objects_only(parts_b, infer_type)):
        return False
    req_a, req_b = _required(parts_a), _required(parts_b)
    if any(_forbidden(parts_a, name) for name in req_b) or any(_forbidden(parts_b, name) for name in req_a):
        return True
    if strict and any(_never_written(parts_a, name) for name in req_b) \
            and any(_never_written(parts_b, name) for name in req_a):
        return True
    budget = [_MAX_EXPANSIONS]
    for mine, other in ((parts_a, parts_b), (parts_b, parts_a)):
        for name, va in _required_values(mine, resolve, formats, 0, budget).items():
            vb = _values(other, name, formats)
            if va is not None and vb is not None and not va & vb:
                return True
    return False


def _required_values(parts: list[dict], resolve: Callable[[str], Any], formats: frozenset[str], depth: int,
                     budget: list[int]) -> dict[str, set[Hashable] | None]:
    """The properties every value of the branch holds, each with its possible values where known. A
    property that all of a disjunction's branches require is required (the value matches one of them)."""
    out: dict[str, set[Hashable] | None] = {name: _values(parts, name, formats) for name in _required(parts)}
    for p in parts:
        for key in ("anyOf", "oneOf"):
            branches = p.get(key)
            if not isinstance(branches, list) or not branches or depth >= _MAX_DEPTH or budget[0] < len(branches):
                continue
            budget[0] -= len(branches)
            per = [_required_values(_conjuncts(b, resolve, formats, depth + 1), resolve, formats, depth + 1, budget)
                   for b in branches]
            for name in set(per[0]).intersection(*per[1:]):
                values = [r[name] for r in per]
                given = [v for v in values if v is not None]
                union = None if len(given) < len(values) else set().union(*given)
                known = out.get(name)
                out[name] = union if known is None else known if union is None else known & union
    return out


def _conjuncts(schema: object, resolve: Callable[[str], Any], formats: frozenset[str], depth: int) -> list[dict]:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return []
    s = normalize(schema, formats)
    out = [s]
    if isinstance(s.get("$ref"), str):
        out += _conjuncts(resolve(s["$ref"]), resolve, formats, depth + 1)
    for sub in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
        out += _conjuncts(sub, resolve, formats, depth + 1)
    return out


def _own_values(parts: list[dict]) -> set[Hashable] | None:
    """The branch's possible values (json_key: JSON Schema's equality) where some conjunct's const/enum lists them;
    else None. Two enums of strings with no value in common (a common oneOf) share no value."""
    for p in parts:
        if "const" in p:
            return {json_key(p["const"])}
        if isinstance(p.get("enum"), list):
            return {json_key(v) for v in p["enum"]}
    return None


def _objects_only(parts: list[dict], infer_type: Callable[[dict], str | None]) -> bool:
    """Whether the branch compiles to objects only: the compiler reads its top part's implied type too."""
    if any(p.get("type") in ("object", ["object"]) for p in parts):
        return True  # a conjunct's type: every value of the branch is an object
    top = parts[0] if parts else {}
    return not set(top) & _NOT_DIRECT and infer_type(top) == "object"


def _first_item_types(parts: list[dict], formats: frozenset[str]) -> set[str] | None:
    """For a branch of non-empty arrays only, the types its first item may have (integer within
    number), where some conjunct's `items` names them; else None."""
    if not any(p.get("type") in ("array", ["array"]) for p in parts) or \
            not any(isinstance(p.get("minItems"), int) and p["minItems"] >= 1 for p in parts):
        return None
    for p in parts:
        items = normalize(p["items"], formats) if isinstance(p.get("items"), dict) else {}
        if "type" in items and "prefixItems" not in p:
            types = as_types(items["type"])
            return types | {"integer"} if "number" in types else types
    return None


def _forbidden(parts: list[dict], name: str) -> bool:
    """Whether some conjunct allows no property `name`."""
    for p in parts:
        props = p.get("properties", {}) if isinstance(p.get("properties"), dict) else {}
        if props.get(name) is False:
            return True
        if p.get("additionalProperties") is False and name not in props and not p.get("patternProperties"):
            return True
    return False


def _never_written(parts: list[dict], name: str) -> bool:
    """Whether the branch's objects, as the compiler writes them (declared properties only, where it
    declares some and allows no others), never hold `name`. Keywords that could add properties
    (combinators inside, patterns, explicit additional properties) void the proof."""
    declared: set[str] = set()
    for p in parts:
        if set(p) & _ADDS_PROPERTIES or p.get("additionalProperties", False) is not False \
                or p.get("unevaluatedProperties", False) is not False:
            return False
        props = p.get("properties", {})
        required = p.get("required", [])
        if not isinstance(props, dict) or not isinstance(required, list):
            return False
        declared |= {*props, *(r for r in required if isinstance(r, str))}
    return bool(declared) and name not in declared


def _required(parts: list[dict]) -> set[str]:
    return {name for p in parts if isinstance(p.get("required"), list) for name in p["required"]
            if isinstance(name, str)}


def _values(parts: list[dict], name: str, formats: frozenset[str]) -> set[Hashable] | None:
    """The property's possible values (json_key: JSON Schema's equality) from some conjunct's const/enum, or None.
    A conjunct that does not name the property (nor has patterns) gives its `additionalProperties`."""
    for p in parts:
        props = p.get("properties", {}) if isinstance(p.get("properties"), dict) else {}
        sub = props.get(name) if name in props or p.get("patternProperties") else p.get("additionalProperties")
        if not isinstance(sub, dict):
            continue
        s = normalize(sub, formats)
        if "const" in s:
            return {json_key(s["const"])}
        if isinstance(s.get("enum"), list):
            return {json_key(v) for v in s["enum"]}
    return None
