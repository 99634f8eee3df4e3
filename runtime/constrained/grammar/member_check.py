"""JSON objects (or unions of them) whose members a grammar reads in any order, checked on the parser's stack.

The grammar reads such an object as `{` list `}` with `list: M_i | M_i tail`, `tail: sep list` (right-recursive,
so every member written stays on the stack; `tail` makes the state after each separator one for every M_i,
where `M_i sep list` made one per member written last, each with a goto on every M_j: n^2 per object) and `M_i: tag_i <key i> : <value i>`, one M_i per distinct member (a
key and its value's schema), `tag_i` an empty rule. The LALR table reduces `tag_i` when the lexer hands it
member i's first terminal, before shifting it: there a guard walks the stack down through the members
written so far (their M_j nodes and separators) and vetoes a key written twice, or a member no branch of
the union allows beside the ones written. Reducing `list: M_i` (the last member, once per object) checks
that some branch still allowed has all its required keys. A vetoed terminal is not acceptable there, so
the lexer never reads it and the mask leaves it out; a comma no member could follow is vetoed alike (an
empty rule before it): no dead ends, no blow-up (2^n sets written are
never built; the lexers built are those of the sets a decode visits).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .lalr import LalrTable, Stack

Guard = Callable[[LalrTable, Stack, int], bool]
Annotator = Callable[[LalrTable, Stack, int], int]
NESTED_REACH = 4  # stack nodes between a value's list and its member's tag (the key, the brace, a boundary)


@dataclass(slots=True)
class MemberCheck:
    """One checked object (a union of `len(required)` branches) by its rules' names."""
    list_rule: str
    sep_rule: str
    body_rule: str  # what the braces hold: the list, or nothing where a branch requires nothing
    more_rule: str  # an empty rule before each comma: reduced there, it vetoes a comma no member can follow
    tail_rule: str  # `tail: sep list`
    members: dict[str, tuple[int, int]]  # member rule -> (key id, -1 for an undeclared key; branches allowing it)
    tags: dict[str, str]  # tag rule -> its member rule
    required: tuple[int, ...]  # per branch: the key ids it requires, as bits
    nested: dict[str, Nested] = field(default_factory=dict)  # member rule -> its value's union, where it has one
    outer: Nested | None = None  # this object as such a value: the member holding it


@dataclass(slots=True)
class Nested:
    """A key that branches declare with different objects as values (one value per branch group): one member
    whose value is the union of those objects (`inner`), each of its branches mapped back to the outer
    branches that declare it. Its node carries the outer branches its value kept (an annotation); the
    value's own checks start from the outer branches still allowed, so no branch choice inside the value
    dead-ends once it closes."""
    inner: MemberCheck
    outer: MemberCheck
    tag_rule: str  # the outer member's tag
    to_outer: tuple[int, ...]  # per inner branch: the outer branches whose value it is
    open_bits: int  # outer branches that take any value for the key (undeclared there)


def guards(checks: tuple[MemberCheck, ...]) -> tuple[dict[str, Guard], dict[str, Annotator]]:
    """The table's guards and annotators for `checks`."""
    out: dict[str, Guard] = {}
    notes: dict[str, Annotator] = {}
    for check in checks:
        for tag, member in check.tags.items():
            out[tag] = _tag_guard(check, *check.members[member])
        out[check.list_rule] = _end_guard(check)
        out[check.body_rule] = _empty_guard(check)
        out[check.more_rule] = _more_guard(check)
        notes[check.list_rule] = _list_note(check)
        notes[check.tail_rule] = _passed_on
        notes[check.body_rule] = _body_note(check)
        for member, nested in check.nested.items():
            notes[member] = _member_note(nested)
    return out, notes


def _written(check: MemberCheck, table: LalrTable, stack: Stack | None) -> tuple[int, int]:
    """The keys written in the innermost list of `check` on `stack` (bits) and the branches they allow."""
    keys, branches = 0, (1 << len(check.required)) - 1
    while stack is not None:
        sym = table.symbols[table.top(stack)]
        if sym != check.sep_rule:
            member = check.members.get(sym)
            if member is None:
                break
            key, allowed = member
            keys |= 1 << key if key >= 0 else 0
            branches &= table.tag(stack) or allowed  # a nested value's node: the outer branches it kept
        stack = table.parent(stack)
    if check.outer is not None:
        branches &= _from_outer(check.outer, table, stack)
    return keys, branches


def _from_outer(nested: Nested, table: LalrTable, stack: Stack | None) -> int:
    """The value's branches that the outer object's branches still allowed at its member's tag permit."""
    for _ in range(NESTED_REACH):
        if stack is None:
            break
        if table.symbols[table.top(stack)] == nested.tag_rule:
            _, outer = _written(nested.outer, table, table.parent(stack))
            if outer & nested.open_bits:
                break
            return sum(1 << j for j, bits in enumerate(nested.to_outer) if bits & outer)
        stack = table.parent(stack)
    return -1


def _satisfied(check: MemberCheck, keys: int, branches: int) -> int:
    return sum(1 << b for b, need in enumerate(check.required) if branches >> b & 1 and keys & need == need)


def _tag_guard(check: MemberCheck, key: int, allowed: int) -> Guard:
    def guard(table: LalrTable, stack: Stack, size: int) -> bool:
        keys, branches = _written(check, table, stack)
        return not (key >= 0 and keys >> key & 1) and bool(branches & allowed)
    return guard


def _end_guard(check: MemberCheck) -> Guard:
    def guard(table: LalrTable, stack: Stack, size: int) -> bool:
        if size != 1:  # `list: M tail`: the last member's `list: M` checked already
            return True
        return bool(_satisfied(check, *_written(check, table, stack)))
    return guard


def _more_guard(check: MemberCheck) -> Guard:
    def guard(table: LalrTable, stack: Stack, size: int) -> bool:
        keys, branches = _written(check, table, stack)
        return any(branches & allowed and (key < 0 or not keys >> key & 1) for key, allowed in check.members.values())
    return guard


def _empty_guard(check: MemberCheck) -> Guard:
    def guard(table: LalrTable, stack: Stack, size: int) -> bool:
        return size != 0 or bool(_satisfied(check, *_written(check, table, stack)))  # `{}`
    return guard


def _body_note(check: MemberCheck) -> Annotator:
    """The body's node carries the branches its object satisfies (its list's, or those `{}` satisfies)."""
    def note(table: LalrTable, stack: Stack, size: int) -> int:
        return table.tag(stack) if size else _satisfied(check, *_written(check, table, stack))
    return note


def _passed_on(table: LalrTable, stack: Stack, size: int) -> int:
    """`tail: sep list` carries its list's branches on."""
    return table.tag(stack)


def _list_note(check: MemberCheck) -> Annotator:
    """A list's node carries the branches it satisfies (`list: M tail` passes its tail's on)."""
    def note(table: LalrTable, stack: Stack, size: int) -> int:
        return _satisfied(check, *_written(check, table, stack)) if size == 1 else table.tag(stack)
    return note


def _member_note(nested: Nested) -> Annotator:
    """A nested member's node carries the outer branches its value satisfies."""
    inner = nested.inner

    def note(table: LalrTable, stack: Stack, size: int) -> int:
        kept, node = 0, stack  # type: int, Stack | None
        for _ in range(size):
            if node is None:
                break
            if table.symbols[table.top(node)] == inner.body_rule:
                kept = table.tag(node)
                break
            node = table.parent(node)
        out = nested.open_bits
        for j, bits in enumerate(nested.to_outer):
            out |= bits if kept >> j & 1 else 0
        return out
    return note
