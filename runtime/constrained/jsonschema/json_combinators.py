"""allOf (merged keyword by keyword, else intersected), anyOf / oneOf (a union where no value can
match two branches, else an exactly-one product of their automata), enum / const, and dependencies
(as allOf of choices)."""
from __future__ import annotations

import json
from typing import Any

from ..json_equality import json_key, same_json
from ..regex import regex_ast as ra
from ..regex.automaton import exactly_one, intersection
from ..regex.fsa import ConstraintTooLarge
from .contract import SchemaCompiler
from .json_disjoint import provably_disjoint
from .json_required_choice import required_choice
from .json_scalars import compiled_or_nothing, const_text
from .json_types import KNOWN_FORMATS, as_types, first_chars, infer_type, json_type, unchecked_format
from .schema_merge import MAX_BRANCHES, Clash, Unsatisfiable, conjoin_all, conjoin_sub, normalize


def merged_all_of(schema: dict) -> dict | None:
    """An `allOf`-only schema of plain parts (no `$ref`, no nested `allOf`) merged into one, if it merges."""
    parts = schema.get("allOf")
    if set(schema) != {"allOf"} or not isinstance(parts, list) or not parts:
        return None
    if not all(isinstance(part, dict) and "$ref" not in part and "allOf" not in part for part in parts):
        return None
    try:
        merged = conjoin_all(normalize(part, KNOWN_FORMATS) for part in parts)
    except Clash:
        return None
    return merged if isinstance(merged, dict) else None


def dependencies_as_all_of(s: dict, path: str) -> dict:
    """Each dependency as a choice: the trigger property absent, or present with what it needs."""
    rest = {k: v for k, v in s.items() if k not in ("dependentRequired", "dependentSchemas")}
    split = _split_by_discriminator(s, rest)
    if split is not None:
        return split
    choices = []
    for name, needs in s.get("dependentRequired", {}).items():
        choices.append({"anyOf": [{"properties": {name: False}}, {"required": [name, *needs]}]})
    for name, sub in s.get("dependentSchemas", {}).items():
        choices.append({"anyOf": [{"properties": {name: False}}, {"allOf": [{"required": [name]}, sub]}]})
    if 2 ** len(choices) > MAX_BRANCHES:
        raise ValueError(f"json_schema at {path}: more than {MAX_BRANCHES.bit_length() - 1} dependencies "
                         "on one object are not supported")
    return {**rest, "allOf": [*rest.get("allOf", []), *choices]}


def _split_by_discriminator(s: dict, rest: dict) -> dict | None:
    """Dependencies that each only narrow one enum property's values (`"a": {"properties": {"kind":
    {"enum": [...]}}}`) as one choice per value of it, plus one without it: each choice forbids the
    triggers whose dependency excludes its value. Linear in the values, where choices per dependency
    would multiply out. None when the dependencies have another shape."""
    deps = s.get("dependentSchemas", {})
    if "dependentRequired" in s or not isinstance(deps, dict) or not deps:
        return None
    allowed: dict[str, Any] = {}  # trigger -> the values its dependency allows; "" -> the property they name
    for trigger, dep in deps.items():
        props = dep.get("properties") if isinstance(dep, dict) and set(dep) == {"properties"} else None
        if not isinstance(props, dict) or len(props) != 1:
            return None
        (key, sub), = props.items()
        narrowed = _named_values({k: v for k, v in sub.items() if k != "description"} if isinstance(sub, dict) else sub)
        if narrowed is None or allowed.setdefault("", key) != key:
            return None
        allowed[trigger] = narrowed
    key = allowed.pop("")
    values = normalize(rest.get("properties", {}).get(key, {}), frozenset()).get("enum")
    if not isinstance(values, list) or len(values) + 1 > MAX_BRANCHES:
        return None
    choices: list[dict[str, Any]] = [{"properties": {key: False}}]
    choices += [{"required": [key], "properties": {key: {"const": v}, **{t: False for t, ok in allowed.items()
                                                                         if not any(same_json(v, w) for w in ok)}}}
                for v in values]
    return {**rest, "allOf": [*rest.get("allOf", []), {"anyOf": choices}]}


def all_of(c: SchemaCompiler, s: dict, path: str) -> ra.Node:
    """Merges the parts keyword by keyword; parts that do not merge are intersected as languages.
    A merged schema that inlines a `$ref` is compiled once per content, as a rule where it recurs:
    a cycle through `$ref`s with sibling keywords would otherwise inline itself without end."""
    inlined: list[str] = []
    parts = _flatten(c, s, path, set(), inlined)
    try:
        merged = _conjoined(parts)
    except Clash:
        return _intersect(c, parts, path)
    if not inlined:
        return c.compile(merged, path)
    key = "allOf:" + json.dumps(merged, sort_keys=True, default=repr)
    name = c.merged_names.setdefault(key, f"all_of_{len(c.merged_names)}")
    return c.named(key, merged, name, path)


def _conjoined(parts: list[Any]) -> object:
    """The parts merged into one schema; where they clash, with their conditionals split by value first."""
    try:
        return conjoin_all(parts)
    except Clash:
        split = _split_conditionals(parts)
        if split is parts:
            raise
        return conjoin_all(split)


def _split_conditionals(parts: list[Any]) -> list[Any]:
    """allOf members that are each an if/then/else on one property's const/enum (`if: {properties:
    {kind: {const: "a"}}}`), as one choice per value they name, plus one for the property absent and
    one for any other value; each choice holds the then/else schemas that apply to it. Linear in the
    conditions, where one choice per if/then/else would multiply out. Parts of other shapes stay."""
    conds: list[tuple[list, bool, Any, Any]] = []  # (values, `if` requires the property, then, else)
    key = None
    for part in parts:
        cond = _value_condition(part)
        if cond is None or (key is not None and cond[0] != key):
            continue
        key = cond[0]
        conds.append((cond[1], cond[2], part.get("then", True), part.get("else", True)))
    if len(conds) < 2:
        return parts
    values = list({json_key(v): v for vals, _, _, _ in conds for v in vals}.values())
    if len(values) + 2 > MAX_BRANCHES or not all(isinstance(v, str) for v in values):  # `not: {enum}` takes strings
        return parts

    def applying(value: object) -> list[Any]:
        return [then if any(same_json(value, v) for v in vals) else other for vals, _, then, other in conds]

    choices = [{"allOf": [{"properties": {key: False}}, *(other if req else then for _, req, then, other in conds)]},
               {"allOf": [{"required": [key], "properties": {key: {"not": {"enum": values}}}},
                          *(other for *_, other in conds)]}]
    choices += [{"allOf": [{"required": [key], "properties": {key: {"const": v}}}, *applying(v)]} for v in values]
    rest = [p for p in parts if (cond := _value_condition(p)) is None or cond[0] != key]
    return [*rest, {"anyOf": choices}]


def _value_condition(part: object) -> tuple[str, list, bool] | None:
    """(property, values, whether `if` requires it) of a part `{if: {properties: {p: {const|enum}}}, then, else}`."""
    if not isinstance(part, dict) or not set(part) <= {"if", "then", "else"} or not isinstance(part.get("if"), dict):
        return None
    cond = part["if"]
    props = cond.get("properties")
    if not set(cond) <= {"properties", "required"} or not isinstance(props, dict) or len(props) != 1:
        return None
    (name, sub), = props.items()
    values = _named_values(sub)
    if cond.get("required", [name]) not in ([name], []) or values is None:
        return None
    return name, values, "required" in cond and cond["required"] == [name]


def _named_values(sub: object) -> list | None:
    """The values a `{const | enum [, type]}` schema admits (those of its types); None for another shape."""
    if not isinstance(sub, dict) or set(sub) - {"const", "enum", "type"}:
        return None
    values = [sub["const"]] if "const" in sub else sub.get("enum")
    if not isinstance(values, list) or ("const" in sub and "enum" in sub) or ("type" in sub and not values):
        return None
    return [v for v in values if "type" not in sub or json_type(v) in as_types(sub["type"])
            or (json_type(v) == "integer" and "number" in as_types(sub["type"]))]


def _flatten(c: SchemaCompiler, schema: object, path: str, seen: set[str], inlined: list[str]) -> list[Any]:
    """The conjuncts of a schema: `allOf` members and inlined `$ref` targets (listed in `inlined`),
    normalized."""
    if not isinstance(schema, dict):
        return [schema]
    if (report := unchecked_format(schema, path)) is not None:  # merged away below, so reported here
        c.unenforced.append(report)
    s = normalize(schema, KNOWN_FORMATS)
    out: list[Any] = []
    if "$ref" in s:
        key, target = c.refs.resolve(s["$ref"], path)
        if key in seen:
            raise ValueError(f"json_schema at {path}: $ref {s['$ref']!r} is an allOf member of itself")
        inlined.append(key)
        out += _flatten(c, target, key, seen | {key}, inlined)
    subs = s.get("allOf", [])
    if not isinstance(subs, list):
        raise ValueError(f"json_schema allOf at {path} must be a list")
    for i, sub in enumerate(subs):
        out += _flatten(c, sub, f"{path}/allOf/{i}", seen, inlined)
    rest = {k: v for k, v in s.items() if k not in ("$ref", "allOf")}
    return out + [rest] if rest or not out else out


def _intersect(c: SchemaCompiler, parts: list[Any], path: str) -> ra.Node:
    nodes = c.exact(lambda: [c.compile(p, path) for p in parts])
    if any(ra.refs(n) for n in nodes):
        raise ValueError(f"json_schema allOf at {path}: its subschemas do not merge and one is recursive")
    node = compiled_or_nothing(intersection(nodes))
    if node == ra.NOTHING:
        raise Unsatisfiable(f"the allOf at {path} has no common value")
    return node


# the most NFA states (ra.size) a oneOf's overlapping branches may total for their exact product: past it the
# product would run for seconds and end past MAX_DFA_STATES anyway (JSONSchemaBench's o9804: 25M and 175M, 3 and
# 7 s, then refused; the largest that built among 1,500 schemas totalled 39k), so it is refused at once, or with
# oneOf relaxed read as anyOf (reported)
EXACT_ONE_MAX_SIZE = 1_000_000


def combinator(c: SchemaCompiler, key: str, s: dict, path: str) -> ra.Node:
    subs = s[key]
    if not isinstance(subs, list) or not subs:
        raise ValueError(f"json_schema {key} at {path} must be a non-empty list")
    rest = {k: v for k, v in s.items() if k != key}
    free = [i for i, sub in enumerate(subs) if matches_every_value(c, sub, path)]
    if key == "anyOf" and free:  # a branch every value matches: the anyOf holds for every value
        return c.compile(rest or True, path)
    if key == "oneOf" and free and "not" not in rest:  # a branch every value matches: exactly one means no other
        if len(free) > 1:
            raise Unsatisfiable(f"two oneOf branches at {path} match every value")
        others = [sub for i, sub in enumerate(subs) if i != free[0]]
        return c.compile({**rest, "not": {"anyOf": others}} if others else rest or True, path)
    subs = required_choice(key, subs, KNOWN_FORMATS) or subs
    branches = [conjoin_sub(rest, sub) if rest else sub for sub in subs]
    if key == "anyOf":
        return c.union([lambda i=i, b=b: c.compile(b, f"{path}/anyOf/{i}") for i, b in enumerate(branches)],
                          path)
    nodes, kept = _branches(c, branches, path)

    def as_any_of(why: str) -> ra.Node:
        """The branches' union, reported: values matching two of them get through."""
        c.unenforced.append(f"oneOf at {path or '#'} ({why}, as anyOf)")
        return c.union([lambda i=i, b=b: c.compile(b, f"{path}/oneOf/{i}") for i, b in enumerate(branches)], path)

    if _disjoint(c, nodes, kept, path):
        return c.alternatives(nodes, [lambda b=b, i=i: c.compile(b, f"{path}/oneOf/{i}")
                                         for i, b in enumerate(kept)])
    if not c.strict and not any(ra.refs(n) for n in nodes):
        # open objects' languages leave out some values (deep undeclared ones, other orders): a value
        # outside one branch's language may still satisfy it, so "in exactly one" would let it through.
        # The branches' strict forms write declared properties only, which the disjointness proof and
        # the product below read exactly as the baseline strict compiler does
        c.strict = True
        try:
            nodes, kept = _branches(c, branches, path)
            apart = _disjoint(c, nodes, kept, path)
        finally:
            c.strict = False
        c.keeps_order(f"property order and undeclared properties at {path or '#'} (oneOf branches that "
                      "may overlap, in the strict form)")
        if apart:
            return ra.alt(*nodes)
    if any(ra.refs(n) for n in nodes) and "oneOf" in c.relaxed:  # recursive branches have no product automaton
        return as_any_of("recursive branches that may overlap")
    if any(ra.refs(n) for n in nodes) and not c.exact_depth:
        # a union of rules would let values matching two branches through: recompile them whole
        nodes, kept = c.exact(lambda: _branches(c, branches, path))
    size = sum(ra.size(n) for n in nodes)
    if size > EXACT_ONE_MAX_SIZE:
        if "oneOf" in c.relaxed and not c.exact_depth:  # inside another exact language a union would read wrong
            return as_any_of("branches too large for an exact product")
        raise ConstraintTooLarge(f"json_schema oneOf at {path or '#'}: its branches may overlap, and they are too "
                                 f"large (about {size:,} NFA states) for the product that keeps values matching "
                                 f"exactly one")
    return exactly_one_of(c, nodes, path)


def matches_every_value(c: SchemaCompiler, sub: object, path: str) -> bool:
    """Whether a branch is `true`, `{}` (annotations aside), or a chain of plain `$ref`s to one."""
    for _ in range(8):
        if sub is True:
            return True
        if not isinstance(sub, dict):
            return False
        s = normalize(sub, KNOWN_FORMATS)
        if set(s) != {"$ref"}:
            return not s
        sub = c.refs.resolve(s["$ref"], path)[1]
    return False


def _branches(c: SchemaCompiler, branches: list[Any], path: str) -> tuple[list[ra.Node], list[Any]]:
    """The satisfiable oneOf branches, compiled, and their schemas."""
    nodes, kept = [], []
    for i, branch in enumerate(branches):
        try:
            nodes.append(c.compile(branch, f"{path}/oneOf/{i}"))
            kept.append(branch)
        except Unsatisfiable:
            continue
    if not nodes:
        raise Unsatisfiable(f"no oneOf branch at {path} is satisfiable")
    return nodes, kept


def _disjoint(c: SchemaCompiler, nodes: list[ra.Node], branches: list[Any], path: str) -> bool:
    """Whether no value can match two branches: their first characters differ, or a required
    discriminator property's values do."""
    firsts = [first_chars(n, c.rules, set(), c.pending_firsts) for n in nodes]

    def disjoint(i: int, j: int) -> bool:
        f, g = firsts[i], firsts[j]
        if f is not None and g is not None and not ra.intersect(f, g):
            return True
        return provably_disjoint(
            branches[i], branches[j], lambda ref: c.refs.resolve(ref, path)[1], KNOWN_FORMATS, infer_type,
            c.strict)

    return all(disjoint(i, j) for i in range(len(nodes)) for j in range(i + 1, len(nodes)))


def exactly_one_of(c: SchemaCompiler, nodes: list[ra.Node], path: str) -> ra.Node:
    """Values matching exactly one of branches that may overlap: a product of their DFAs (not for
    recursive branches)."""
    if len(nodes) == 1:
        return nodes[0]
    if any(ra.refs(n) for n in nodes):
        raise ValueError(f"json_schema oneOf at {path}: recursive branches that may match the same value "
                         "are not supported (branches must differ in their first character or in the "
                         "const/enum values of a required property)")
    dfa = exactly_one(nodes)
    if dfa.accept.max() < 0:
        raise Unsatisfiable(f"no value matches exactly one oneOf branch at {path}")
    return ra.Compiled(dfa)


def enum(c: SchemaCompiler, s: dict, path: str) -> ra.Node:
    values = [s["const"]] if "const" in s else None
    if "enum" in s:
        if not isinstance(s["enum"], list) or not s["enum"]:
            raise ValueError(f"json_schema enum at {path} must be a non-empty list")
        values = s["enum"] if values is None else [v for v in values if v in s["enum"]]
    assert values is not None, "the compiler calls enum() on a schema with const or enum"
    rest = {k: v for k, v in s.items() if k not in ("enum", "const")}
    if "type" in rest:
        allowed = as_types(rest.pop("type"))
        values = [v for v in values if json_type(v) in allowed
                  or (json_type(v) == "integer" and "number" in allowed)]
    if not values:
        raise Unsatisfiable(f"no enum/const value at {path} satisfies the schema's other keywords")
    if not rest:
        return ra.alt(*(ra.literal(const_text(v)) for v in values))
    by_type: dict[str, list] = {}  # a keyword constrains only values of its own type: each type apart
    for v in values:
        by_type.setdefault("number" if json_type(v) == "integer" else json_type(v), []).append(v)
    kept = []
    for t, group in by_type.items():
        other = c.exact(lambda: c.compile({**rest, "type": t}, path))
        if ra.refs(other):
            raise ValueError(f"json_schema at {path}: enum/const together with keywords {sorted(rest)} "
                             "on a recursive value is not supported")
        kept.append(compiled_or_nothing(intersection([ra.alt(*(ra.literal(const_text(v)) for v in group)), other])))
    out = ra.alt(*(k for k in kept if k != ra.NOTHING))
    if out == ra.NOTHING:
        raise Unsatisfiable(f"no enum/const value at {path} satisfies the schema's other keywords")
    return out
