"""What a schema's keywords say about its values' JSON types and first characters, and how a compiled
node starts: the compiler uses these to infer a missing `type`, to tell alternatives apart by their
first character, and to choose which pieces become rules of their own."""
from __future__ import annotations

from typing import Iterable, overload

from ..regex import regex_ast as ra
from .json_scalars import FORMATS
from .schema_merge import normalize

KNOWN_FORMATS = frozenset(FORMATS)
# JSON Schema's own formats (2020-12, section 7.3) that no regex here checks: validators that assert formats check
# them (jsonschema's format checker does), so a schema naming one on a string compiles with the format reported as
# not enforced. Any other unknown format ("int32", "path") is an annotation and is dropped silently, as the spec says
UNCHECKED_FORMATS = frozenset({"idn-email", "idn-hostname", "iri", "iri-reference", "json-pointer",
                               "relative-json-pointer", "regex", "uri-template"})


def unchecked_format(schema: dict, path: str) -> str | None:
    """The report of a format of UNCHECKED_FORMATS that `schema` names for its strings ("format regex at <path>"), if
    any (a schema whose `type` rules out strings names it for nothing)."""
    name, types = schema.get("format"), schema.get("type")
    if name not in UNCHECKED_FORMATS or isinstance(types, (str, list)) and "string" not in as_types(types):
        return None
    return f"format {name} at {path or '#'}"


_TYPE_HINTS = (
    ("object", {"properties", "required", "additionalProperties", "patternProperties", "propertyNames",
                "minProperties", "maxProperties", "unevaluatedProperties"}),
    ("array", {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "unevaluatedItems"}),
    ("string", {"pattern", "format", "minLength", "maxLength"}),
    ("number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
)


def infer_type(schema: dict) -> str | None:
    """The type a schema's keywords imply, when it names none (a strict choice: other types would
    be unconstrained by those keywords)."""
    keys = set(schema)
    return next((t for t, hints in _TYPE_HINTS if keys & hints), None)


def as_types(value: str | Iterable[str]) -> set[str]:
    return {value} if isinstance(value, str) else set(value)


def json_type(value: object) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value == int(value) else "number"
    names: dict[type, str] = {str: "string", list: "array", dict: "object"}
    return names[type(value)]


_TYPE_FIRSTS = {"object": "{", "array": "[", "string": '"', "integer": "-0-9", "number": "-0-9", "boolean": "tf",
                "null": "n"}


def type_first_chars(schema: object) -> ra.Ranges | None:
    """The first characters of a schema's values, from its `type` alone (None when it has no type)."""
    if not isinstance(schema, dict):
        return None
    s = normalize(schema, KNOWN_FORMATS)
    types = s.get("type") if not set(s) & {"$ref", "allOf", "anyOf", "oneOf"} else None
    if types is None or "enum" in s or "const" in s:
        return None
    node = ra.alt(*(ra.char_class(_TYPE_FIRSTS[t]) for t in as_types(types) if t in _TYPE_FIRSTS))
    return node.ranges if isinstance(node, ra.Chars) else None


def first_chars(node: ra.Node, rules: dict[str, ra.Node], seen: set[str],
                 pending: dict[str, ra.Ranges | None]) -> ra.Ranges | None:
    """The characters a match of `node` can start with; None when unknown or it may match nothing."""
    if isinstance(node, ra.Chars):
        return node.ranges
    if isinstance(node, ra.Ref):
        if node.name in seen:
            return ()  # a rule at its own start adds no first character
        if node.name not in rules:
            return pending.get(node.name)  # a rule still being compiled: known by its type, if any
        return first_chars(rules[node.name], rules, seen | {node.name}, pending)
    if isinstance(node, ra.Alt):
        parts = [first_chars(x, rules, seen, pending) for x in node.items]
        known = [p for p in parts if p is not None]
        return None if len(known) < len(parts) else ra.normalize(r for p in known for r in p)
    if isinstance(node, ra.Seq):
        out: list = []
        for item in node.items:
            # an optional item (e.g. a number's "-?") starts as its item
            start = item.item if isinstance(item, ra.Repeat) and item.min == 0 else item
            first = first_chars(start, rules, seen, pending)
            if first is not None and not ra.nullable(item):
                return ra.normalize([*out, *first])
            if first is None:  # nullable with unknown start: be conservative
                return None
            out += first
        return None
    if isinstance(node, ra.Repeat | ra.Bounded):
        first = first_chars(node.item, rules, seen, pending)
        return None if isinstance(node, ra.Repeat) and node.min == 0 else first
    if isinstance(node, ra.Compiled):
        if node.dfa.accept[node.dfa.start] >= 0:
            return None
        row = node.dfa.trans[node.dfa.start]
        return ra.normalize(r for c, ranges in enumerate(node.dfa.alphabet.classes) if row[c] >= 0 for r in ranges)
    return None


def lexes_alone(node: ra.Node) -> bool:
    """Whether every match starts with '{', '[' or '"' (an object, array or string: each ends where
    its bracket or quote closes, so a rule of its own lexes well, as a number would not)."""
    first = node
    while isinstance(first, ra.Seq) and first.items:
        first = first.items[0]
    return isinstance(first, ra.Chars) and first.ranges in (((0x7B, 0x7B),), ((0x5B, 0x5B),), ((0x22, 0x22),))


@overload
def count_keyword(schema: dict, key: str, default: int, path: str) -> int: ...
@overload
def count_keyword(schema: dict, key: str, default: None, path: str) -> int | None: ...
def count_keyword(schema: dict, key: str, default: int | None, path: str) -> int | None:
    value = schema.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"json_schema {key} at {path} must be a non-negative integer, got {value!r}")
    return value
