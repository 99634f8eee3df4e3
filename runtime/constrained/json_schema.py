"""JSON Schema -> a grammar: a regex tree per rule, with `Ref`s where schemas recurse.

Objects emit their properties in schema order (required ones always, optional ones maybe); numbers
and strings get exact regexes for their bounds, lengths, patterns and formats. A schema without
recursion comes out as one regular expression (the fast DFA path); a recursive one (a `$ref` cycle,
or an unconstrained value, which is any JSON) comes out as rules for the LALR engine.
Whitespace between tokens follows one finite pattern; compact (none) by default.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any

from ..config import JSON_MAX_EXPONENT_DIGITS, JSON_MAX_FRACTION_DIGITS, JSON_MAX_INT_DIGITS
from . import regex_ast as ra
from .automaton import compile_dfa, exactly_one
from .regex_parser import parse_regex

ANNOTATIONS = frozenset({
    "title", "description", "default", "examples", "$schema", "$id", "$comment", "deprecated",
    "readOnly", "writeOnly", "discriminator", "$defs", "definitions",
})
SUPPORTED = frozenset({
    "type", "enum", "const", "properties", "required", "additionalProperties", "items", "prefixItems",
    "minItems", "maxItems", "uniqueItems", "minLength", "maxLength", "pattern", "format", "minimum",
    "maximum", "exclusiveMinimum", "exclusiveMaximum", "anyOf", "oneOf", "allOf", "$ref",
}) | ANNOTATIONS
JSON_TYPES = ("object", "array", "string", "integer", "number", "boolean", "null")
ANY_VALUE = "json_value"  # the rule for an unconstrained JSON value

_DIGIT = ra.char_class("0-9")
_HEX = ra.char_class("0-9a-fA-F")
# what a JSON string may hold without escaping: no quote, backslash or control character
STRING_CHARS = ra.complement(ra.normalize([(0, 0x1F), (ord('"'), ord('"')), (ord("\\"), ord("\\"))]))
_ESCAPE = ra.alt(
    ra.seq(ra.literal("\\"), ra.char_class('"\\/bfnrt')),
    # \\u escapes outside the surrogate block, so every escape is exactly one character
    ra.seq(ra.literal("\\u"), ra.alt(ra.seq(ra.char_class("0-9a-cA-Ce-fE-F"), ra.repeat(_HEX, 3, 3)),
                                     ra.seq(ra.char_class("dD"), ra.char_class("0-7"), ra.repeat(_HEX, 2, 2)))),
)
_STRING_CHAR = ra.alt(ra.Chars(STRING_CHARS), _ESCAPE)


def _r(pattern: str) -> ra.Node:
    return parse_regex(pattern)


_DATE = _r(r"[0-9]{4}-(?:(?:0[13578]|1[02])-(?:0[1-9]|[12][0-9]|3[01])|(?:0[469]|11)-(?:0[1-9]|[12][0-9]|30)"
           r"|02-(?:0[1-9]|1[0-9]|2[0-8]))")
_TIME = _r(r"(?:[01][0-9]|2[0-3]):[0-5][0-9]:[0-5][0-9](?:\.[0-9]{1,6})?(?:Z|[+-](?:[01][0-9]|2[0-3]):[0-5][0-9])")
FORMATS: dict[str, ra.Node] = {
    "date": _DATE,
    "time": _TIME,
    "date-time": ra.seq(_DATE, ra.literal("T"), _TIME),
    "email": _r(r"[a-zA-Z0-9._%+-]{1,64}@[a-zA-Z0-9-]{1,63}(?:\.[a-zA-Z0-9-]{1,63}){0,3}\.[a-zA-Z]{2,8}"),
    "uuid": _r(r"[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}"),
    "ipv4": _r(r"(?:(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])\.){3}(?:25[0-5]|2[0-4][0-9]|1[0-9][0-9]|[1-9]?[0-9])"),
}
JSON_WHITESPACE = frozenset(b" \t\n\r")


@dataclass(slots=True)
class JsonGrammar:
    root: ra.Node
    rules: dict[str, ra.Node] = field(default_factory=dict)  # empty: `root` is a plain regex


def schema_to_dict(schema: Any) -> dict | bool:
    """A schema given as a dict, a JSON string, or a pydantic model class, as a plain dict."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict | bool):
        raise ValueError("json_schema must be a dict, a JSON string, or a pydantic model class, "
                         f"got {type(schema).__name__}")
    return schema


def whitespace_node(pattern: str | None) -> ra.Node:
    """The whitespace allowed between JSON tokens: none (compact) or a finite pattern of JSON blanks."""
    if pattern is None:
        return ra.EMPTY
    node = parse_regex(pattern)
    dfa = compile_dfa([node])
    if not dfa.is_finite():
        raise ValueError(f"JSON whitespace pattern {pattern!r} must match a bounded length (e.g. '[ ]?')")
    used = {int(b) for b in range(256) if (dfa.trans[:, b] >= 0).any()}
    if not used <= JSON_WHITESPACE:
        raise ValueError(f"JSON whitespace pattern {pattern!r} may only match spaces, tabs and newlines")
    return node


def compile_json_schema(schema: Any, whitespace: str | None = None) -> JsonGrammar:
    root = schema_to_dict(schema)
    compiler = _SchemaCompiler(root, whitespace_node(whitespace))
    node = compiler.compile(root, "#")
    return JsonGrammar(node, compiler.rules)


class _SchemaCompiler:
    def __init__(self, root: dict | bool, ws: ra.Node):
        self.root = root
        self.ws = ws
        self.rules: dict[str, ra.Node] = {}
        self._inline: dict[str, ra.Node] = {}
        self._open: set[str] = set()
        self._recursive: set[str] = set()

    # ---- tokens -------------------------------------------------------------------------------
    def punct(self, c: str) -> ra.Node:
        return ra.seq(self.ws, ra.literal(c), self.ws)

    def const(self, value: Any) -> ra.Node:
        return ra.literal(json.dumps(value, ensure_ascii=False, separators=(",", ":")))

    # ---- dispatch -----------------------------------------------------------------------------
    def compile(self, schema: Any, path: str) -> ra.Node:
        if schema is True or schema == {}:
            return self.any_value()
        if schema is False:
            raise ValueError(f"json_schema at {path} is `false`: no value can satisfy it")
        if not isinstance(schema, dict):
            raise ValueError(f"json_schema at {path} must be an object or a boolean, got {schema!r}")
        unknown = sorted(set(schema) - SUPPORTED)
        if unknown:
            raise ValueError(f"json_schema keyword {unknown[0]!r} at {path} is not supported "
                             f"(unsupported here: {unknown})")
        if "$ref" in schema:
            extra = sorted(set(schema) - ANNOTATIONS - {"$ref"})
            if extra:
                raise ValueError(f"json_schema at {path}: keywords {extra} beside $ref are not supported")
            return self.ref(schema["$ref"], path)
        if "allOf" in schema:
            return self.all_of(schema, path)
        for key in ("anyOf", "oneOf"):
            if key in schema:
                subs = schema[key]
                if not isinstance(subs, list) or not subs:
                    raise ValueError(f"json_schema {key} at {path} must be a non-empty list")
                base = {k: v for k, v in schema.items() if k != key}
                nodes = [self.compile(_merge(base, s, f"{path}/{key}/{i}"), f"{path}/{key}/{i}")
                         for i, s in enumerate(subs)]
                return self.one_of(nodes, path) if key == "oneOf" else ra.alt(*nodes)
        if "const" in schema:
            return self.const(schema["const"])
        if "enum" in schema:
            values = schema["enum"]
            if not isinstance(values, list) or not values:
                raise ValueError(f"json_schema enum at {path} must be a non-empty list")
            return ra.alt(*(self.const(v) for v in values))
        types = schema.get("type", _infer_type(schema))
        if types is None:
            return self.any_value()
        if isinstance(types, str):
            types = [types]
        if not isinstance(types, list):  # e.g. {"type": 7}
            raise ValueError(f"json_schema type at {path} must be a type name or a list of them, got {types!r}")
        bad = [t for t in types if t not in JSON_TYPES]
        if bad or not types:
            raise ValueError(f"json_schema type at {path} must be one of {JSON_TYPES}, got {schema['type']!r}")
        return ra.alt(*(self.typed(t, schema, path) for t in types))

    def typed(self, t: str, schema: dict, path: str) -> ra.Node:
        if t == "object":
            return self.object(schema, path)
        if t == "array":
            return self.array(schema, path)
        if t == "string":
            return self.string(schema, path)
        if t == "integer":
            return integer_node(*_int_bounds(schema, path))
        if t == "number":
            return self.number(schema, path)
        if t == "boolean":
            return ra.alt(ra.literal("true"), ra.literal("false"))
        return ra.literal("null")

    # ---- references -----------------------------------------------------------------------------
    def ref(self, ref: Any, path: str) -> ra.Node:
        if not isinstance(ref, str) or not ref.startswith("#"):
            raise ValueError(f"json_schema $ref {ref!r} at {path}: only local references ('#...') are supported")
        if ref in self._inline:
            return self._inline[ref]
        if ref in self._open:
            self._recursive.add(ref)
            return ra.Ref(self._rule_name(ref))
        self._open.add(ref)
        body = self.compile(_resolve(self.root, ref), ref)
        self._open.discard(ref)
        if ref in self._recursive:
            self.rules[self._rule_name(ref)] = body
            node = ra.Ref(self._rule_name(ref))
        else:
            node = body
        self._inline[ref] = node
        return node

    def one_of(self, nodes: list[ra.Node], path: str) -> ra.Node:
        """Values matching exactly one branch. Recursive branches fall back to a plain union (sound
        when they are disjoint, as discriminated unions are)."""
        if len(nodes) == 1 or any(ra.refs(n) for n in nodes):
            return ra.alt(*nodes)
        dfa = exactly_one(nodes)
        if dfa.accept.max() < 0:
            raise ValueError(f"json_schema oneOf at {path}: no value matches exactly one branch")
        return ra.Compiled(dfa)

    def _rule_name(self, ref: str) -> str:
        slug = "".join(c if c.isalnum() else "_" for c in ref[1:]).strip("_").lower()
        return f"ref_{slug}" if slug else "ref_root"

    def all_of(self, schema: dict, path: str) -> ra.Node:
        subs = schema["allOf"]
        if not isinstance(subs, list) or len(subs) != 1:
            raise ValueError(f"json_schema allOf at {path}: only a single subschema is supported")
        base = {k: v for k, v in schema.items() if k != "allOf"}
        return self.compile(_merge(base, subs[0], f"{path}/allOf/0"), f"{path}/allOf/0")

    def any_value(self) -> ra.Node:
        if ANY_VALUE not in self.rules:
            self.rules[ANY_VALUE] = ra.NOTHING  # placeholder while the rule refers to itself
            value = ra.Ref(ANY_VALUE)
            pair = ra.seq(string_node(0, None), self.punct(":"), value)
            self.rules[ANY_VALUE] = ra.alt(
                ra.seq(ra.literal("{"), self.ws, ra.optional(ra.seq(pair, ra.repeat(ra.seq(self.punct(","), pair), 0, None))),
                       self.ws, ra.literal("}")),
                ra.seq(ra.literal("["), self.ws, ra.optional(ra.seq(value, ra.repeat(ra.seq(self.punct(","), value), 0, None))),
                       self.ws, ra.literal("]")),
                string_node(0, None), number_node(None, None), ra.literal("true"), ra.literal("false"), ra.literal("null"),
            )
        return ra.Ref(ANY_VALUE)

    # ---- containers ---------------------------------------------------------------------------
    def object(self, schema: dict, path: str) -> ra.Node:
        props = schema.get("properties", {})
        required = schema.get("required", [])
        if not isinstance(props, dict) or not isinstance(required, list):
            raise ValueError(f"json_schema at {path}: properties must be an object and required a list")
        members = [(name, sub) for name, sub in props.items()]
        members += [(name, True) for name in required if name not in props]
        extra = schema.get("additionalProperties", True)
        if not members and extra is not False:
            value = self.compile(extra, f"{path}/additionalProperties")
            pair = ra.seq(string_node(0, None), self.punct(":"), value)
            body = ra.optional(ra.seq(pair, ra.repeat(ra.seq(self.punct(","), pair), 0, None)))
        else:
            items = [(ra.seq(self.const(name), self.punct(":"), self.compile(sub, f"{path}/properties/{name}")),
                      name in required) for name, sub in members]
            body = self.members(items)
        return ra.seq(ra.literal("{"), self.ws, body, self.ws, ra.literal("}"))

    def members(self, items: list[tuple[ra.Node, bool]]) -> ra.Node:
        """Comma-separated members in order: required ones always, optional ones maybe."""
        comma = self.punct(",")
        options = []
        for i, (node, req) in enumerate(items):  # item i is the first one present
            rest = [ra.seq(comma, n) if r else ra.optional(ra.seq(comma, n)) for n, r in items[i + 1:]]
            options.append(ra.seq(node, *rest))
            if req:
                break
        else:
            options.append(ra.EMPTY)
        return ra.alt(*options)

    def array(self, schema: dict, path: str) -> ra.Node:
        if schema.get("uniqueItems", False):
            raise ValueError(f"json_schema keyword 'uniqueItems' at {path} is not supported")
        lo, hi = _count(schema, "minItems", 0, path), _count(schema, "maxItems", None, path)
        if hi is not None and hi < lo:
            raise ValueError(f"json_schema at {path}: maxItems {hi} is below minItems {lo}")
        comma = self.punct(",")
        prefix = [self.compile(s, f"{path}/prefixItems/{i}") for i, s in enumerate(schema.get("prefixItems", []))]
        items = schema.get("items", True)
        options = [_joined(prefix[:n], comma) for n in range(lo, min(len(prefix), len(prefix) if hi is None else hi) + 1)]
        if items is not False and (hi is None or hi > len(prefix)):  # items after the prefix
            rest = self.compile(items, f"{path}/items")
            more_lo, more_hi = max(lo - len(prefix), 1), None if hi is None else hi - len(prefix)
            if prefix:
                options.append(ra.seq(_joined(prefix, comma), ra.repeat(ra.seq(comma, rest), more_lo, more_hi)))
            else:
                options.append(ra.seq(rest, ra.repeat(ra.seq(comma, rest), more_lo - 1,
                                                      None if more_hi is None else more_hi - 1)))
        if not options:
            raise ValueError(f"json_schema at {path}: no array length satisfies minItems/maxItems/prefixItems")
        return ra.seq(ra.literal("["), self.ws, ra.alt(*options), self.ws, ra.literal("]"))

    # ---- scalars ------------------------------------------------------------------------------
    def string(self, schema: dict, path: str) -> ra.Node:
        lo, hi = _count(schema, "minLength", 0, path), _count(schema, "maxLength", None, path)
        if "format" in schema:
            fmt = schema["format"]
            if fmt not in FORMATS:
                raise ValueError(f"json_schema string format {fmt!r} at {path} is not supported; "
                                 f"supported formats: {sorted(FORMATS)}")
            return ra.seq(ra.literal('"'), FORMATS[fmt], ra.literal('"'))
        if "pattern" in schema:
            if "minLength" in schema or "maxLength" in schema:
                raise ValueError(f"json_schema at {path}: pattern together with minLength/maxLength is not supported")
            return ra.seq(ra.literal('"'), pattern_node(schema["pattern"], path), ra.literal('"'))
        return string_node(lo, hi)

    def number(self, schema: dict, path: str) -> ra.Node:
        lo, hi = _bound(schema, "minimum", "exclusiveMinimum", path), _bound(schema, "maximum", "exclusiveMaximum", path)
        if lo is None and hi is None:
            return number_node(None, None)
        low = None if lo is None else (math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0]))
        high = None if hi is None else (math.ceil(hi[0]) - 1 if hi[1] else math.floor(hi[0]))
        if low is not None and high is not None and low > high:
            raise ValueError(f"json_schema at {path}: no number in the bounds (bounds are rounded inward to integers)")
        return number_node(low, high)


# ---- helpers ----------------------------------------------------------------------------------
def _joined(items: list[ra.Node], comma: ra.Node) -> ra.Node:
    return ra.seq(*(ra.seq(comma, x) if i else x for i, x in enumerate(items)))


def _infer_type(schema: dict) -> str | None:
    keys = set(schema)
    if keys & {"properties", "required", "additionalProperties"}:
        return "object"
    if keys & {"items", "prefixItems", "minItems", "maxItems"}:
        return "array"
    if keys & {"pattern", "format", "minLength", "maxLength"}:
        return "string"
    if keys & {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum"}:
        return "number"
    return None


def _merge(base: dict, sub: Any, path: str) -> Any:
    """A subschema of anyOf/oneOf/allOf, with the parent's other keywords applied to it."""
    rest = {k: v for k, v in base.items() if k not in ANNOTATIONS}
    if not rest:
        return sub
    if not isinstance(sub, dict):
        raise ValueError(f"json_schema at {path} must be an object")
    clash = sorted(k for k in set(rest) & set(sub) if rest[k] != sub[k])
    if clash:
        raise ValueError(f"json_schema at {path}: keywords {clash} both beside and inside a combinator are not supported")
    return {**rest, **sub}


def _resolve(root: Any, ref: str) -> Any:
    node = root
    for part in ref[1:].lstrip("/").split("/") if ref != "#" else []:
        part = part.replace("~1", "/").replace("~0", "~")
        if isinstance(node, dict) and part in node:
            node = node[part]
        elif isinstance(node, list) and part.isdigit() and int(part) < len(node):
            node = node[int(part)]
        else:
            raise ValueError(f"json_schema $ref {ref!r} does not resolve")
    return node


def _count(schema: dict, key: str, default: int | None, path: str) -> int | None:
    value = schema.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"json_schema {key} at {path} must be a non-negative integer, got {value!r}")
    return value


def _bound(schema: dict, key: str, exclusive_key: str, path: str) -> tuple[float, bool] | None:
    """(bound, exclusive) from draft-6+ numeric or draft-4 boolean exclusive keywords."""
    value, excl = schema.get(key), schema.get(exclusive_key)
    for k, v in ((key, value), (exclusive_key, excl)):
        if v is not None and not isinstance(v, bool | int | float):
            raise ValueError(f"json_schema {k} at {path} must be a number, got {v!r}")
    if isinstance(excl, bool):
        return None if value is None else (value, excl)
    if excl is not None and value is not None:
        tighter = excl >= value if key == "minimum" else excl <= value
        return (excl, True) if tighter else (value, False)
    if excl is not None:
        return (excl, True)
    return None if value is None else (value, False)


def _int_bounds(schema: dict, path: str) -> tuple[int | None, int | None]:
    lo, hi = _bound(schema, "minimum", "exclusiveMinimum", path), _bound(schema, "maximum", "exclusiveMaximum", path)
    low = None if lo is None else (math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0]))
    high = None if hi is None else (math.ceil(hi[0]) - 1 if hi[1] else math.floor(hi[0]))
    if low is not None and high is not None and low > high:
        raise ValueError(f"json_schema at {path}: no integer lies in [{low}, {high}]")
    return low, high


def string_node(lo: int, hi: int | None) -> ra.Node:
    return ra.seq(ra.literal('"'), ra.repeat(_STRING_CHAR, lo, hi), ra.literal('"'))


def pattern_node(pattern: Any, path: str) -> ra.Node:
    """A string `pattern` (search semantics, so unanchored ends match anything), raw characters only."""
    if not isinstance(pattern, str):
        raise ValueError(f"json_schema pattern at {path} must be a string")
    try:
        node = parse_regex(pattern, allowed=STRING_CHARS)
    except ValueError as e:
        raise ValueError(f"json_schema pattern at {path}: {e}") from None
    anything = ra.repeat(ra.Chars(STRING_CHARS), 0, None)
    head = ra.EMPTY if pattern.startswith(("^", "\\A")) else anything
    tail = ra.EMPTY if pattern.endswith(("$", "\\Z")) and not pattern.endswith("\\$") else anything
    return ra.seq(head, node, tail)


def integer_node(lo: int | None, hi: int | None) -> ra.Node:
    parts = []
    if lo is None or lo < 0:  # negatives: "-" and a magnitude >= 1
        mag_lo = 1 if hi is None or hi >= 0 else -hi
        parts.append(ra.seq(ra.literal("-"), natural_range(mag_lo, None if lo is None else -lo)))
    if hi is None or hi >= 0:
        parts.append(natural_range(max(lo or 0, 0), hi))
    return ra.alt(*parts)


def number_node(lo: int | None, hi: int | None) -> ra.Node:
    """JSON numbers; bounded ones (integer bounds) without exponent, split by sign and magnitude."""
    frac = ra.optional(ra.seq(ra.literal("."), ra.repeat(_DIGIT, 1, JSON_MAX_FRACTION_DIGITS)))
    if lo is None and hi is None:
        exp = ra.optional(ra.seq(ra.char_class("eE"), ra.optional(ra.char_class("+-")),
                                 ra.repeat(_DIGIT, 1, JSON_MAX_EXPONENT_DIGITS)))
        return ra.seq(ra.optional(ra.literal("-")), natural_range(0, None), frac, exp)
    zero_frac = ra.optional(ra.seq(ra.literal("."), ra.repeat(ra.literal("0"), 1, JSON_MAX_FRACTION_DIGITS)))

    def magnitudes(a: int, b: int | None) -> ra.Node:  # values m with a <= m <= b
        if b is None:
            return ra.seq(natural_range(a, None), frac)
        whole = ra.seq(natural_range(b, b), zero_frac)
        return whole if b - 1 < a else ra.alt(ra.seq(natural_range(a, b - 1), frac), whole)

    parts = []
    if lo is None or lo < 0:
        parts.append(ra.seq(ra.literal("-"), magnitudes(0 if hi is None or hi >= 0 else -hi, None if lo is None else -lo)))
    if hi is None or hi >= 0:
        parts.append(magnitudes(max(lo or 0, 0), hi))
    return ra.alt(*parts)


def natural_range(lo: int, hi: int | None) -> ra.Node:
    """Decimal naturals in [lo, hi] without leading zeros; hi=None caps the length instead."""
    if hi is None:
        width = len(str(lo))
        top = 10 ** width - 1
        longer = ra.seq(ra.char_class("1-9"), ra.repeat(_DIGIT, width, JSON_MAX_INT_DIGITS - 1)) \
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
    if lo[0] == hi[0]:
        return ra.seq(ra.literal(lo[0]), _same_width(lo[1:], hi[1:]))
    k = len(lo) - 1
    parts = [ra.seq(ra.literal(lo[0]), _same_width(lo[1:], "9" * k))]
    if int(hi[0]) - int(lo[0]) > 1:
        parts.append(ra.seq(ra.char_class(f"{int(lo[0]) + 1}-{int(hi[0]) - 1}"), ra.repeat(_DIGIT, k, k)))
    parts.append(ra.seq(ra.literal(hi[0]), _same_width("0" * k, hi[1:])))
    return ra.alt(*parts)
