"""Objects in a grammar whose members take any order, each at most once, checked as the parser reduces
(grammar/member_check): past the eager automaton's size (json_objects), instead of the declared order, and
unions of such objects as one checked object whose branches the members written narrow down.

A union's members are its branches' distinct (key, value) pairs; a pair belongs to the branches that
declare it, and to those whose undeclared members take any value (the schema's default) where they do
not declare its key. Undeclared members of any value are one kind, keyed apart from every declared name;
others (a schema, patternProperties) stay their branch's. One key whose values differ by branch but start
alike (objects: the LALR table could not tell them apart) is one member whose value is the union of those
objects, checked itself, its branches mapped back to the outer ones (member_check.Nested). Where members
still start alike (a value that is no object), no checked form (the caller keeps the declared order).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..grammar.member_check import MemberCheck, Nested
from ..grammar.rule_grammar import ref_free_runs
from ..regex import regex_ast as ra
from ..regex.automaton import difference
from .contract import SchemaCompiler
from .json_scalars import STRING_CHARS, compiled_or_nothing, const_text, quoted


@dataclass(frozen=True, slots=True)
class ObjectShape:
    """An object's members, for a checked form: each declared one as (name, `"key":value` node, required, value)."""
    members: tuple[tuple[str, ra.Node, bool, ra.Node], ...]
    declared: frozenset[str]  # every name the object declares, those no value can take too
    extra: tuple[ra.Node, ...]  # its undeclared members' `"key":value` nodes (json_objects._extra_pairs)
    open_any: bool  # undeclared members: any key not declared, any value (no patternProperties, propertyNames)


@dataclass(slots=True)
class _Member:
    name: str | None  # None: undeclared
    node: ra.Node
    branches: int
    nested: tuple[MemberCheck, tuple[int, ...], int] | None = None  # (value's union, to_outer, open_bits)


def checked_object(c: SchemaCompiler, shapes: list[ObjectShape]) -> ra.Node | None:
    """The object (or union of objects) as a checked grammar object, registered in `c.member_checks`;
    None where members would start alike."""
    made = _checked(c, shapes)
    return None if made is None else made[0]


def _checked(c: SchemaCompiler, shapes: list[ObjectShape]) -> tuple[ra.Node, MemberCheck] | None:
    union = len(shapes) > 1
    by_name: dict[str, dict[ra.Node, list]] = {}  # name -> value -> [member node, branches bits]
    for b, shape in enumerate(shapes):
        for name, node, _, value in shape.members:
            by_name.setdefault(name, {}).setdefault(value, [node, 0])[1] |= 1 << b
    members: list[_Member] = []
    for name, values in by_name.items():
        # a branch open to any value takes other branches' keys it does not declare, with their values (a subset of
        # any value: where another branch declares `k` a string, the open one's `"k":1` is refused); before, only in
        # a grammar whose undeclared values are rules, so a union of large objects lost the open branch at `k`
        open_bits = sum(1 << b for b, s in enumerate(shapes) if union and s.open_any
                        and name not in s.declared)
        if len({_first_run(node) for node, _ in values.values()}) < len(values):  # values alike at first
            member = _nested(c, name, values, open_bits)
            if member is None:
                return None
            members.append(member)
        elif len(values) == 1:  # the key a terminal of its own: the lexer after `{` or a comma reads keys only
            (value, (_, bits)), = values.items()
            node = ra.seq(ra.literal(const_text(name)), c.punct(":"), c.boundary(), value)
            members.append(_Member(name, node, bits | open_bits))
        else:  # values told apart by their first terminal (a discriminating const): each in its key's terminal
            members += [_Member(name, node, bits | open_bits) for node, bits in values.values()]
    # undeclared members of their own kind (a schema, patternProperties): their branch's alone, read apart
    # where their keys meet another branch's (the lexer takes one reading: a valid text may be refused, never
    # an invalid one accepted)
    members += [_Member(None, node, 1 << b) for b, s in enumerate(shapes) if not (union and s.open_any)
                for node in s.extra]
    if union and any(s.open_any for s in shapes):
        names = sorted(set().union(*(s.declared for s in shapes)))
        raw = [ra.literal(json.dumps(n, ensure_ascii=False)[1:-1]) for n in names]
        key = compiled_or_nothing(difference(quoted(ra.repeat(ra.Chars(STRING_CHARS), 0, None)), quoted(ra.alt(*raw))))
        members.append(_Member(None, ra.seq(key, c.punct(":"), c.undeclared_value()),
                               sum(1 << b for b, s in enumerate(shapes) if s.open_any)))
    firsts = [_first_run(m.node) for m in members]
    if len(set(firsts)) < len(firsts):
        return None
    key_ids = {name: i for i, name in enumerate(by_name)}
    required = tuple(sum(1 << key_ids[name] for name, _, req, _ in s.members if req) for s in shapes)
    same = (tuple((m.name, m.node, m.branches) for m in members), required)
    if same in c.checked_objects:  # one object met twice (a union remade split, a $ref inlined twice): one
        return c.checked_objects[same]  # set of rules, else two alike would reduce on one key (LALR conflict)
    prefix = f"members{len(c.member_checks)}_"
    c.rules[f"{prefix}more"] = ra.EMPTY
    c.rules[f"{prefix}sep"] = ra.seq(ra.Ref(f"{prefix}more"), c.punct(","))
    c.rules[f"{prefix}tail"] = ra.seq(ra.Ref(f"{prefix}sep"), ra.Ref(f"{prefix}list"))
    check = MemberCheck(f"{prefix}list", f"{prefix}sep", f"{prefix}body", f"{prefix}more", f"{prefix}tail", {}, {},
                        required)
    alts = []
    for i, m in enumerate(members):
        tag, rule = f"{prefix}tag{i}", f"{prefix}m{i}"
        c.rules[tag] = ra.EMPTY
        c.rules[rule] = ra.seq(ra.Ref(tag), m.node)
        check.members[rule], check.tags[tag] = (-1 if m.name is None else key_ids[m.name], m.branches), rule
        if m.nested is not None:
            inner, to_outer, open_bits = m.nested
            check.nested[rule] = inner.outer = Nested(inner, check, tag, to_outer, open_bits)
        alts += [ra.Ref(rule), ra.seq(ra.Ref(rule), ra.Ref(check.tail_rule))]
    c.rules[check.list_rule] = ra.alt(*alts)
    c.member_checks.append(check)
    body: ra.Node = ra.Ref(check.list_rule)
    c.rules[check.body_rule] = body if all(check.required) else ra.alt(ra.EMPTY, body)
    made = c.checked_objects[same] = (c.bracketed("{", ra.Ref(check.body_rule), "}"), check)
    c.shapes[made[0]] = tuple(shapes)  # a union of unions unites their branches
    return made


def _nested(c: SchemaCompiler, name: str, values: dict[ra.Node, list], open_bits: int) -> _Member | None:
    """One member for `name` whose value is the union of the branches' objects (member_check.Nested); None
    where a value is not an object of a known shape."""
    groups = [c.shapes.get(c.rules.get(v.name, v) if isinstance(v, ra.Ref) else v) for v in values]
    if not all(groups):
        return None
    made = _checked(c, [s for group in groups for s in group])  # type: ignore[union-attr]  # all found
    if made is None:
        return None
    node = ra.seq(ra.literal(const_text(name)), c.punct(":"), made[0])
    to_outer = tuple(bits for group, (_, bits) in zip(groups, values.values()) for _ in group)  # type: ignore[union-attr]
    return _Member(name, node, sum(to_outer) | open_bits, (made[1], to_outer, open_bits))


def _first_run(node: ra.Node) -> ra.Node:
    """The first terminal the grammar makes of `node` (its leading rule-free items)."""
    items = node.items if isinstance(node, ra.Seq) else (node,)
    return ref_free_runs(tuple(items))[0]
