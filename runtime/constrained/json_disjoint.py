"""A schema-level proof that two `oneOf` branches share no value: both accept objects only, and both
require a property (a discriminator, as in tagged unions) whose const/enum values do not overlap.

Sound, not complete: every keyword read is a conjunct of the branch (top-level keywords, `allOf`
members, plain `$ref` targets), so each only narrows what the branch accepts; anything else is
ignored, which can only make the proof fail.
"""
from __future__ import annotations

import json
from typing import Any, Callable

from .schema_merge import normalize

_MAX_DEPTH = 8  # $ref / allOf hops followed, at most


def provably_disjoint(a: Any, b: Any, resolve: Callable[[str], Any], formats: frozenset[str]) -> bool:
    parts_a, parts_b = _conjuncts(a, resolve, formats, 0), _conjuncts(b, resolve, formats, 0)
    if not (_objects_only(parts_a) and _objects_only(parts_b)):
        return False
    shared = _required(parts_a) & _required(parts_b)
    for name in shared:
        va, vb = _values(parts_a, name, formats), _values(parts_b, name, formats)
        if va is not None and vb is not None and not va & vb:
            return True
    return False


def _conjuncts(schema: Any, resolve: Callable[[str], Any], formats: frozenset[str], depth: int) -> list[dict]:
    if not isinstance(schema, dict) or depth > _MAX_DEPTH:
        return []
    s = normalize(schema, formats)
    out = [s]
    if isinstance(s.get("$ref"), str):
        out += _conjuncts(resolve(s["$ref"]), resolve, formats, depth + 1)
    for sub in s.get("allOf", []) if isinstance(s.get("allOf"), list) else []:
        out += _conjuncts(sub, resolve, formats, depth + 1)
    return out


def _objects_only(parts: list[dict]) -> bool:
    return any(p.get("type") in ("object", ["object"]) for p in parts)


def _required(parts: list[dict]) -> set[str]:
    return {name for p in parts if isinstance(p.get("required"), list) for name in p["required"]
            if isinstance(name, str)}


def _values(parts: list[dict], name: str, formats: frozenset[str]) -> set[str] | None:
    """The property's possible values (as canonical JSON text) from some conjunct's const/enum, or None."""
    for p in parts:
        sub = p.get("properties", {}).get(name) if isinstance(p.get("properties"), dict) else None
        if not isinstance(sub, dict):
            continue
        s = normalize(sub, formats)
        if "const" in s:
            return {_canonical_text(s["const"])}
        if isinstance(s.get("enum"), list):
            return {_canonical_text(v) for v in s["enum"]}
    return None


def _canonical_text(value: Any) -> str:
    """Equal JSON values, equal texts (1 and 1.0 alike; true and 1 not)."""
    if isinstance(value, float) and value == int(value):
        value = int(value)
    return json.dumps(value, sort_keys=True)
