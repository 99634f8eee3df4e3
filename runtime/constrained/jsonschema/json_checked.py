"""Objects in a grammar whose members take any order, each at most once, checked as the parser reduces
(grammar/member_check): past the eager automaton's size (json_objects), instead of the declared order, and
unions of such objects as one checked object whose branches the members written narrow down.

A union's members are its branches' distinct (key, value) pairs; a pair belongs to the branches that
declare it, and to those whose undeclared members take any value (the schema's default) where they do
not declare its key. Undeclared members of any value are one kind, keyed apart from every declared name;
others (a schema, patternProperties) stay their branch's. Where two
members would start with the same terminal (one key, two values that begin with a rule), the LALR table
could not tell them apart: no checked form then (the caller keeps the declared order).
"""
from __future__ import annotations

import json
from dataclasses import dataclass

from ..grammar.member_check import MemberCheck
from ..grammar.rule_grammar import ref_free_runs
from ..regex import regex_ast as ra
from ..regex.automaton import difference
from .contract import SchemaCompiler
from .json_scalars import STRING_CHARS, compiled_or_nothing, quoted


@dataclass(frozen=True, slots=True)
class ObjectShape:
    """An object's members, for a checked form: each declared one as (name, `"key":value` node, required)."""
    members: tuple[tuple[str, ra.Node, bool], ...]
    declared: frozenset[str]  # every name the object declares, those no value can take too
    extra: tuple[ra.Node, ...]  # its undeclared members' `"key":value` nodes (json_objects._extra_pairs)
    open_any: bool  # undeclared members: any key not declared, any value (no patternProperties, propertyNames)


def checked_object(c: SchemaCompiler, shapes: list[ObjectShape]) -> ra.Node | None:
    """The object (or union of objects) as a checked grammar object, registered in `c.member_checks`;
    None where members would start alike."""
    union = len(shapes) > 1
    owners: dict[ra.Node, list] = {}  # member node -> [key name, branches bits]
    for b, shape in enumerate(shapes):
        for name, node, _ in shape.members:
            owners.setdefault(node, [name, 0])[1] |= 1 << b
    if union and c.any_undeclared:  # a branch open to any value takes other branches' keys it does not declare
        for entry in owners.values():
            entry[1] |= sum(1 << b for b, s in enumerate(shapes) if s.open_any and entry[0] not in s.declared)
    # undeclared members of their own kind (a schema, patternProperties): their branch's alone, read apart
    # where their keys meet another branch's (the lexer takes one reading: a valid text may be refused, never
    # an invalid one accepted)
    extras = [(node, 1 << b) for b, s in enumerate(shapes) if not (union and s.open_any) for node in s.extra]
    if union and any(s.open_any for s in shapes):
        names = sorted(set().union(*(s.declared for s in shapes)))
        raw = [ra.literal(json.dumps(n, ensure_ascii=False)[1:-1]) for n in names]
        key = compiled_or_nothing(difference(quoted(ra.repeat(ra.Chars(STRING_CHARS), 0, None)), quoted(ra.alt(*raw))))
        extras.append((ra.seq(key, c.punct(":"), c.undeclared_value()),
                       sum(1 << b for b, s in enumerate(shapes) if s.open_any)))
    nodes = [*owners, *(node for node, _ in extras)]
    firsts = [_first_run(node) for node in nodes]
    if len(set(firsts)) < len(firsts):
        return None
    key_ids = {name: i for i, name in enumerate(dict.fromkeys(entry[0] for entry in owners.values()))}
    k = len(c.member_checks)
    prefix = f"members{k}_"
    c.rules[f"{prefix}sep"] = c.punct(",")
    members: dict[str, tuple[int, int]] = {}
    tags: dict[str, str] = {}
    alts = []
    bits = [(key_ids[entry[0]], entry[1]) for entry in owners.values()] + [(-1, allowed) for _, allowed in extras]
    for i, (node, (key_id, allowed)) in enumerate(zip(nodes, bits)):
        tag, member = f"{prefix}tag{i}", f"{prefix}m{i}"
        c.rules[tag] = ra.EMPTY
        c.rules[member] = ra.seq(ra.Ref(tag), node)
        members[member], tags[tag] = (key_id, allowed), member
        alts += [ra.Ref(member), ra.seq(ra.Ref(member), ra.Ref(f"{prefix}sep"), ra.Ref(f"{prefix}list"))]
    c.rules[f"{prefix}list"] = ra.alt(*alts)
    required = tuple(sum(1 << key_ids[name] for name, _, req in s.members if req) for s in shapes)
    c.member_checks.append(MemberCheck(f"{prefix}list", f"{prefix}sep", members, tags, required))
    body: ra.Node = ra.Ref(f"{prefix}list")
    return c.bracketed("{", body if all(required) else ra.optional(body), "}")


def _first_run(node: ra.Node) -> ra.Node:
    """The first terminal the grammar makes of `node` (its leading rule-free items)."""
    items = node.items if isinstance(node, ra.Seq) else (node,)
    return ref_free_runs(tuple(items))[0]
