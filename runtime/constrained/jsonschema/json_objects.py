"""JSON objects: declared properties in schema order, then undeclared ones where `patternProperties` or
an explicit `additionalProperties` allows them, within `minProperties` / `maxProperties`.

Undeclared keys never spell a declared name (in any escaping), a key that `patternProperties` reads
is written with raw characters only (so its pattern sees what the parser decodes), and every key
satisfies `propertyNames`.
"""
from __future__ import annotations

from typing import Any

from ..regex import regex_ast as ra
from ..regex.automaton import compile_dfa, difference, intersection
from .contract import SchemaCompiler
from .json_scalars import STRING_CHARS, compiled_or_nothing, const_text, pattern_body, quoted, spellings, string_body
from .schema_merge import Unsatisfiable, conjoin_sub, property_schema


def object_node(c: SchemaCompiler, s: dict, path: str) -> ra.Node:
    props = s.get("properties", {})
    required = s.get("required", [])
    patterns = s.get("patternProperties", {})
    if not isinstance(props, dict) or not isinstance(required, list) or not isinstance(patterns, dict):
        raise ValueError(f"json_schema at {path}: properties and patternProperties must be objects, required a list")
    names_ok = _name_filter(c, s, path)
    items: list[tuple[ra.Node, bool]] = []
    for name in dict.fromkeys([*props, *required]):
        sub = _declared_schema(s, name)
        req = name in required
        if sub is False or not names_ok(name):
            if req:
                raise Unsatisfiable(f"required property {name!r} at {path} is not allowed")
            continue
        try:
            value = c.compile(sub, f"{path}/properties/{name}")
        except Unsatisfiable:
            if req:
                raise
            continue
        items.append((ra.seq(ra.literal(const_text(name)), c.punct(":"), value), req))
    extra = _extra_pair(c, s, path, [n for n in dict.fromkeys([*props, *required])])
    lo, hi = s.get("minProperties", 0), s.get("maxProperties")
    for key, bound in (("minProperties", lo), ("maxProperties", hi)):
        if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 0):
            raise ValueError(f"json_schema {key} at {path} must be a non-negative integer, got {bound!r}")
    body = _members(c, items, extra, lo, hi, path)
    return c.bracketed("{", body, "}")


def _declared_schema(s: dict, name: str) -> object:
    """The property's schema, with every `patternProperties` entry whose pattern its name matches."""
    sub = property_schema(s, name)
    if name in s.get("properties", {}) and s.get("patternProperties"):
        sub = conjoin_sub(sub, property_schema({"patternProperties": s["patternProperties"]}, name))
    return sub


def _name_filter(c: SchemaCompiler, s: dict, path: str):
    names = s.get("propertyNames")
    if names is None or names is True:
        return lambda name: True
    node = _names_node(c, names, path)
    dfa = compile_dfa([node])

    def ok(name: str) -> bool:
        q = dfa.walk(dfa.start, const_text(name).encode())
        return q >= 0 and bool(dfa.accept[q] >= 0)
    return ok


def _names_node(c: SchemaCompiler, names: object, path: str) -> ra.Node:
    if names is False:
        return ra.NOTHING
    node = c.exact(lambda: c.compile(conjoin_sub({"type": "string"}, names), f"{path}/propertyNames"))
    if ra.refs(node):
        raise ValueError(f"json_schema propertyNames at {path} must describe strings only")
    return node


def _extra_pair(c: SchemaCompiler, s: dict, path: str, declared: list[str]) -> ra.Node | None:
    """One undeclared `"key":value` member, or None where the schema allows none (the strict default)."""
    patterns = s.get("patternProperties", {})
    extra = s.get("additionalProperties", s.get("unevaluatedProperties"))
    if extra is None:
        extra = True if not declared and not patterns else False
    if extra is False and not patterns:
        return None
    taken = [spellings(n) for n in declared]
    pattern_bodies = {p: pattern_body(p, f"{path}/patternProperties") for p in patterns}
    kinds: list[tuple[ra.Node, Any, str]] = []
    for p, sub in patterns.items():
        others = [b for q, b in pattern_bodies.items() if q != p]  # keys two patterns share are left out
        kinds.append((_key(pattern_bodies[p], taken + others), sub, f"{path}/patternProperties/{p}"))
    if extra is not False:
        any_key = ra.repeat(ra.Chars(STRING_CHARS), 0, None) if patterns else string_body()
        kinds.append((_key(any_key, taken + list(pattern_bodies.values())), extra, f"{path}/additionalProperties"))
    if "propertyNames" in s and s["propertyNames"] is not True:
        names = _names_node(c, s["propertyNames"], path)
        kinds = [(compiled_or_nothing(intersection([key, names])), sub, p) for key, sub, p in kinds]
    pairs = []
    for key, sub, where in kinds:
        if key == ra.NOTHING:
            continue
        try:
            pairs.append(ra.seq(key, c.punct(":"), c.compile(sub, where)))
        except Unsatisfiable:
            continue
    return ra.alt(*pairs) if pairs else None


def _key(body: ra.Node, excluded: list[ra.Node]) -> ra.Node:
    """A quoted key whose body matches `body` and none of `excluded`."""
    if not excluded:
        return quoted(body)
    return compiled_or_nothing(difference(quoted(body), quoted(ra.alt(*excluded))))


def _members(c: SchemaCompiler, items: list[tuple[ra.Node, bool]], extra: ra.Node | None,
             lo: int, hi: int | None, path: str) -> ra.Node:
    """Comma-separated members in order (required ones always, optional ones maybe), then any number
    of undeclared ones, counted: an automaton over (next member, count so far, whether a comma is
    due), the count saturating at minProperties when there is no maximum. Each member appears at most
    twice (with and without its comma), so the size stays linear in the members however many are
    optional. With recursive members it becomes right-linear grammar rules (rule_grammar)."""
    # a recursive object is lexed member by member: one lexeme spanning an optional member would read
    # on greedily into the next member's key and fail where that member is absent
    comma = c.separator(any(ra.refs(n) for n, _ in items) or (extra is not None and bool(ra.refs(extra))))
    cap = hi if hi is not None else lo
    ids: dict[tuple[int, int, bool], int] = {}
    edges: list[tuple[int, ra.Node, int]] = []
    finals: list[int] = []
    queue = [(0, 0, True)]
    ids[queue[0]] = 0
    n = len(items)

    def target(state: tuple[int, int, bool]) -> int:
        if state not in ids:
            ids[state] = len(ids)
            queue.append(state)
        return ids[state]

    while queue:
        i, count, first = state = queue.pop()
        src = ids[state]
        nxt_count = min(count + 1, cap) if hi is None else count + 1
        sep = ra.EMPTY if first else comma
        if i < n:
            node, req = items[i]
            if hi is None or count < hi:
                edges.append((src, ra.seq(sep, node), target((i + 1, nxt_count, False))))
            if not req:
                edges.append((src, ra.EMPTY, target((i + 1, count, first))))
            continue
        if count >= lo:
            finals.append(src)
        if extra is not None and (hi is None or count < hi):
            edges.append((src, ra.seq(sep, extra), target((n, nxt_count, False))))
    if not finals:
        raise Unsatisfiable(f"no object at {path} has between minProperties and maxProperties members")
    return ra.Graph(len(ids), tuple(edges), tuple(finals))
