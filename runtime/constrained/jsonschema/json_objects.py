"""JSON objects, within `minProperties` / `maxProperties`, two ways:
- the schema's own semantics (the default): declared properties in any order, each at most once, and
  undeclared ones wherever `additionalProperties` allows them (absent: any value, as JSON Schema says).
  The order is an automaton over the set of properties written so far (2^n states): past
  ANY_ORDER_MAX_PROPERTIES declared properties the object keeps their declared order instead, and the
  compiler reports it ("property order at <path>");
- `strict` (OpenAI's structured outputs, xgrammar's strict mode): declared properties in schema order,
  then undeclared ones only where `patternProperties` or an explicit `additionalProperties` allows them.

Undeclared keys never spell a declared name (in any escaping), a key that `patternProperties` reads
is written with raw characters only (so its pattern sees what the parser decodes), and every key
satisfies `propertyNames`.
"""
from __future__ import annotations

import itertools
import json
from typing import Any

from ..regex import regex_ast as ra
from ..regex.automaton import compile_dfa, intersection, product
from .contract import LazyObject, SchemaCompiler
from .json_checked import ObjectShape, checked_object
from .json_keys import keys_except, raw_keys_except
from .json_scalars import STRING_CHARS, compiled_or_nothing, const_text, pattern_body, quoted, string_body
from .schema_merge import Unsatisfiable, conjoin_sub, property_schema

# declared properties an object writes in any order (an automaton over the subsets written: 2^n states,
# each reading every member not yet written), at most; and the automaton's size (ra.size) at most, as
# its DFA holds a copy of each member's per state. A larger object keeps the declared order (undeclared
# members after the declared ones), reported as unenforced ("property order at <path>")
ANY_ORDER_MAX_PROPERTIES = 6
ANY_ORDER_MAX_SIZE = 4_000
# the same bound where undeclared members may come anywhere among the declared ones (a copy of their value per
# set written). At 1,000, compile + first mask on JSONSchemaBench's 300 (--per-subset 30) read p50 53 ms and
# p99 1.10 s (o70036 1.76 s); at 250, 49 ms and 0.86 s (o70036 0.78 s), same window, with the same schemas compiled
# and the same false rejects (the objects past it keep undeclared members after the declared ones)
ANY_ORDER_EXTRA_MAX_SIZE = 250
# past those, where the schema is one regex, the object is a marker character that object_dispatch
# replaces lazily: control characters, which JSON never writes raw (nor as whitespace), one per object
LAZY_MARKERS = tuple(b for b in range(1, 0x1F) if chr(b) not in " \t\n\r")
# ... and one more for an undeclared value's containers nested past the inline depth (json_schema._any_value):
# object_dispatch lays a level of any JSON container there as a decode reaches it, so such values nest any depth
ANY_MARKER = chr(0x1F)
ANY_MARKER_PATH = "(undeclared values)"  # in `not_lazy`: the schema's undeclared values nest a bounded depth instead
# patternProperties of at most this many patterns: a key several match takes all their schemas, each set of them a
# key kind (2^n - 1 kinds); past it keys two patterns share are refused (schemas hold 1-3 patterns as a rule)
MAX_OVERLAPPING_PATTERNS = 4


def object_node(c: SchemaCompiler, s: dict, path: str) -> ra.Node:
    props = s.get("properties", {})
    required = s.get("required", [])
    patterns = s.get("patternProperties", {})
    if not isinstance(props, dict) or not isinstance(required, list) or not isinstance(patterns, dict):
        raise ValueError(f"json_schema at {path}: properties and patternProperties must be objects, required a list")
    names_ok = _name_filter(c, s, path)
    items: list[tuple[ra.Node, bool]] = []
    members: list[tuple[ra.Node, ra.Node, bool]] = []  # (key, value, required) of the same members
    names: list[str] = []  # ... and their names
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
        members.append((ra.literal(const_text(name)), value, req))
        names.append(name)
    extra_pairs = _extra_pairs(c, s, path, [n for n in dict.fromkeys([*props, *required])])
    extra = ra.alt(*(ra.seq(key, c.punct(":"), value) for key, value in extra_pairs)) if extra_pairs else None
    lo, hi = s.get("minProperties", 0), s.get("maxProperties")
    for key, bound in (("minProperties", lo), ("maxProperties", hi)):
        if bound is not None and (not isinstance(bound, int) or isinstance(bound, bool) or bound < 0):
            raise ValueError(f"json_schema {key} at {path} must be a non-negative integer, got {bound!r}")
    shape = None
    if c.checked and not c.exact_depth and not lo and hi is None:
        said = s.get("additionalProperties", s.get("unevaluatedProperties"))
        shape = ObjectShape(tuple((name, node, req, value) for name, (node, req), (_, value, _) in zip(names, items, members)),
                            frozenset([*props, *required]), tuple(ra.seq(k, c.punct(":"), v) for k, v in extra_pairs),
                            not patterns and s.get("propertyNames", True) is True and (said is None or said in (True, {})))
    if c.strict or (len(items) < 2 and extra is None):
        body = _members(c, items, extra, lo, hi, path)
    elif _any_order_fits(items) or (c.exact_depth and len(items) <= ANY_ORDER_MAX_PROPERTIES):
        body = _any_order_members(c, items, extra, lo, hi, path)
    elif c.exact_depth:  # a language subtracted in declared order would let the other orders through
        raise ValueError(f"json_schema at {path}: an object with more than {ANY_ORDER_MAX_PROPERTIES} properties "
                         "inside oneOf / not / enum is supported only in strict mode")
    elif c.lazy is not None and path not in c.not_lazy and not lo and hi is None and len(c.lazy) < len(LAZY_MARKERS) and not any(
            ra.refs(n) for _, n, _ in members) and not any(ra.refs(n) for _, n in extra_pairs):
        return _lazy_object(c, members, extra_pairs, path)
    elif shape is not None and (checked := checked_object(c, [shape])) is not None:
        def declared_order() -> ra.Node:  # where a union cannot take it checked
            c.keeps_order(f"property order at {path or '#'}")
            return c.bracketed("{", _members(c, items, extra, lo, hi, path), "}")
        c.shapes[checked], c.fallbacks[checked] = (shape,), declared_order
        return checked
    else:
        c.keeps_order(f"property order at {path or '#'}")
        body = _members(c, items, extra, lo, hi, path)
    node = c.bracketed("{", body, "}")
    if shape is not None:
        c.shapes[node] = (shape,)
    return node


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


def _lazy_object(c: SchemaCompiler, members: list[tuple[ra.Node, ra.Node, bool]],
                 extra_pairs: list[tuple[ra.Node, ra.Node]], path: str) -> ra.Node:
    """The object as a marker character that object_dispatch replaces, as decoding reaches it, by an
    automaton over the members written so far (any order, each at most once, every required one)."""
    assert c.lazy is not None, "object_node makes lazy objects only where the compiler collects them"
    marker = chr(LAZY_MARKERS[len(c.lazy)])
    colon = c.punct(":")
    c.lazy.append(LazyObject(marker, tuple(key for key, _, _ in members),
                             tuple(ra.seq(colon, value) for _, value, _ in members),
                             sum(1 << i for i, (_, _, req) in enumerate(members) if req),
                             tuple(key for key, _ in extra_pairs), tuple(ra.seq(colon, value) for _, value in extra_pairs),
                             c.ws, path))
    return ra.literal(marker)


def _extra_pairs(c: SchemaCompiler, s: dict, path: str, declared: list[str]) -> list[tuple[ra.Node, ra.Node]]:
    """The undeclared members' (key, value) kinds, none where the schema allows none (where it says
    nothing: any value by default, none in strict mode unless it declares nothing at all)."""
    patterns = s.get("patternProperties", {})
    extra = s.get("additionalProperties", s.get("unevaluatedProperties"))
    unsaid = extra is None and not c.strict  # JSON Schema's default: any value
    if extra is None:
        extra = True if not c.strict or (not declared and not patterns) else False
    if extra is False and not patterns:
        return []
    pattern_bodies = {p: pattern_body(p, f"{path}/patternProperties") for p in patterns}
    kinds: list[tuple[ra.Node, Any, str]] = _pattern_kinds(patterns, pattern_bodies, declared, path)
    if extra is not False and (unsaid or patterns):  # raw characters only: the declared names' raw spellings to avoid
        if pattern_bodies or not declared:
            key = _raw_key(ra.repeat(ra.Chars(STRING_CHARS), 0, None), declared, list(pattern_bodies.values()))
        else:  # the common case, straight from the names' trie (json_keys)
            key = compiled_or_nothing(raw_keys_except([json.dumps(n, ensure_ascii=False)[1:-1] for n in declared]))
        kinds.append((key, extra, f"{path}/additionalProperties"))
    elif extra is not False:  # straight from the names' trie, escapes too (json_keys)
        key = compiled_or_nothing(keys_except(declared)) if declared else quoted(string_body())
        kinds.append((key, extra, f"{path}/additionalProperties"))
    if "propertyNames" in s and s["propertyNames"] is not True:
        names = _names_node(c, s["propertyNames"], path)
        kinds = [(compiled_or_nothing(intersection([key, names])), sub, p) for key, sub, p in kinds]
    pairs = []
    for i, (key, sub, where) in enumerate(kinds):
        if key == ra.NOTHING:
            continue
        # any value beside declared members, said (`true`, `{}`) or not: bounded as the compiler bounds it
        # where the schema is one regex; a map of any values (nothing declared) holds any JSON
        bounded = (unsaid and i == len(kinds) - 1) or (bool(declared) and (sub is True or sub == {}))
        try:
            pairs.append((key, c.undeclared_value() if bounded else c.compile(sub, where)))
        except Unsatisfiable:
            continue
    return pairs


def _pattern_kinds(patterns: dict, bodies: dict[str, ra.Node], declared: list[str],
                   path: str) -> list[tuple[ra.Node, Any, str]]:
    """The (key, schema, place) kinds of the members `patterns` read. A key that several patterns match takes
    all their schemas (JSON Schema's rule), so up to MAX_OVERLAPPING_PATTERNS patterns each set of them is a
    kind of its own: the keys every one of the set matches and no other does. Past that, keys two patterns
    share are left out (refused, never let through)."""
    kinds: list[tuple[ra.Node, Any, str]] = [  # the keys one pattern alone matches
        (_raw_key(bodies[p], declared, [b for q, b in bodies.items() if q != p]), sub, f"{path}/patternProperties/{p}")
        for p, sub in patterns.items()]
    if len(patterns) > MAX_OVERLAPPING_PATTERNS:
        return kinds
    for size in range(2, len(patterns) + 1):
        for group in itertools.combinations(patterns, size):
            shared = intersection([bodies[p] for p in group])
            if shared.accept.max() < 0:  # no key matches them all
                continue
            others = [b for q, b in bodies.items() if q not in group]
            subs = [patterns[p] for p in group if patterns[p] is not True and patterns[p] != {}]
            sub = True if not subs else subs[0] if len(subs) == 1 else {"allOf": subs}
            kinds.append((_raw_key(ra.Compiled(shared), declared, others), sub, f"{path}/patternProperties"))
    return kinds


def _raw_key(body: ra.Node, names: list[str], others: list[ra.Node]) -> ra.Node:
    """A quoted key whose body, of raw characters only (a pattern's, STRING_CHARS), matches `body`, is none of `names`
    and matches none of `others`. A raw key spells a name one way only, so the names come from their trie
    (json_keys.raw_keys_except), not from a difference with their escaped spellings (most of a pattern-heavy schema's
    compile: each spelling's automaton is built character by character)."""
    parts = [quoted(body), *([ra.Compiled(raw_keys_except(names))] if names else [])]
    if others:
        return compiled_or_nothing(product("all_but_last", [*parts, quoted(ra.alt(*others))]))
    return compiled_or_nothing(intersection(parts)) if names else quoted(body)


class _States:
    """Numbers an automaton's states as they are first reached and queues each to be expanded once."""

    def __init__(self, start: tuple):
        self.ids: dict[tuple, int] = {start: 0}
        self.queue = [start]

    def __call__(self, state: tuple) -> int:
        if state not in self.ids:
            self.ids[state] = len(self.ids)
            self.queue.append(state)
        return self.ids[state]


def _members(c: SchemaCompiler, items: list[tuple[ra.Node, bool]], extra: ra.Node | None,
             lo: int, hi: int | None, path: str) -> ra.Node:
    """Comma-separated members in declared order (required ones always, optional ones maybe), with any
    number of undeclared ones anywhere among them (in the strict form, after them), counted: an automaton over (next member, count so far,
    whether a comma is due, whether the last step wrote a member), the count saturating at minProperties
    when there is no maximum. Undeclared members are read only where the last step wrote one (or at the
    start), never after skipping an optional member, so each text has one path (a grammar made of the
    automaton stays unambiguous). Each member appears at most twice (with and without its comma), so the
    size stays linear in the members however many are optional. With recursive members it becomes
    right-linear grammar rules (rule_grammar)."""
    # a recursive object is lexed member by member: one lexeme spanning an optional member would read
    # on greedily into the next member's key and fail where that member is absent
    comma = c.separator(any(ra.refs(n) for n, _ in items) or (extra is not None and bool(ra.refs(extra))))
    cap = hi if hi is not None else lo
    target = _States((0, 0, True, True))  # (next member, count, first, wrote)
    edges: list[tuple[int, ra.Node, int]] = []
    finals: list[int] = []
    n = len(items)
    while target.queue:
        i, count, first, wrote = state = target.queue.pop()
        src = target.ids[state]
        nxt_count = min(count + 1, cap) if hi is None else count + 1
        sep = ra.EMPTY if first else comma
        if extra is not None and (i == n if c.strict else wrote) and (hi is None or count < hi):
            edges.append((src, ra.seq(sep, extra), target((i, nxt_count, False, True))))
        if i < n:
            node, req = items[i]
            if hi is None or count < hi:
                edges.append((src, ra.seq(sep, node), target((i + 1, nxt_count, False, True))))
            if not req:
                edges.append((src, ra.EMPTY, target((i + 1, count, first, False))))
        elif count >= lo:
            finals.append(src)
    if not finals:
        raise Unsatisfiable(f"no object at {path} has between minProperties and maxProperties members")
    return ra.Graph(len(target.ids), tuple(edges), tuple(finals))


def _any_order_members(c: SchemaCompiler, items: list[tuple[ra.Node, bool]], extra: ra.Node | None,
                       lo: int, hi: int | None, path: str) -> ra.Node:
    """Comma-separated declared members in any order, each at most once, then any undeclared ones: an
    automaton over (declared members written, count so far, whether a comma is due), the count
    saturating at minProperties when there is no maximum. Undeclared members come anywhere where their
    value's automaton, copied once per set of declared members written, fits (`_any_order_fits`), and
    among grammar rules (where a copy costs nothing, and a shared tail would make LALR conflicts); else
    they follow the declared ones (once every required one is written), copied once per count. Final
    where every required member is written and the count is within bounds."""
    ruled = any(ra.refs(n) for n, _ in items) or (extra is not None and bool(ra.refs(extra)))
    comma = c.separator(ruled)
    ruled = ruled or bool(ra.refs(comma)) or _any_order_fits(items, extra)  # members apart (split mode): rules too
    cap = hi if hi is not None else lo
    need = sum(1 << i for i, (_, req) in enumerate(items) if req)
    target = _States((0, 0, True))  # (declared members written, -1: undeclared ones now; count; first)
    edges: list[tuple[int, ra.Node, int]] = []
    finals: list[int] = []
    while target.queue:
        written, count, first = state = target.queue.pop()
        src = target.ids[state]
        done = written < 0 or written & need == need
        if done and count >= lo:
            finals.append(src)
        if hi is not None and count >= hi:
            continue
        nxt_count = min(count + 1, cap) if hi is None else count + 1
        sep = ra.EMPTY if first else comma
        for i, (node, _) in enumerate(items):
            if written >= 0 and not written >> i & 1:
                edges.append((src, ra.seq(sep, node), target((written | 1 << i, nxt_count, False))))
        if extra is not None and (written < 0 or ruled):
            edges.append((src, ra.seq(sep, extra), target((written, nxt_count, False))))
        elif extra is not None and done:
            edges.append((src, ra.EMPTY, target((-1, count, first))))
    if not finals:
        raise Unsatisfiable(f"no object at {path} has between minProperties and maxProperties members")
    return ra.Graph(len(target.ids), tuple(edges), tuple(finals))


def _any_order_fits(items: list[tuple[ra.Node, bool]], extra: ra.Node | None = None) -> bool:
    """Whether the any-order automaton stays within ANY_ORDER_MAX_PROPERTIES and ANY_ORDER_MAX_SIZE (with
    `extra`: undeclared members between any two declared ones, a copy of theirs per set written)."""
    n = len(items)
    if n > ANY_ORDER_MAX_PROPERTIES:
        return False
    if extra is not None:  # a copy of the undeclared value per set written: kept small (ANY_ORDER_EXTRA_MAX_SIZE)
        return (1 << n) * (sum(ra.size(node) for node, _ in items) + ra.size(extra)) / 2 <= ANY_ORDER_EXTRA_MAX_SIZE
    return (1 << n) * sum(ra.size(node) for node, _ in items) / 2 <= ANY_ORDER_MAX_SIZE
