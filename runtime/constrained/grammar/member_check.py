"""JSON objects (or unions of them) whose members a grammar reads in any order, checked on the parser's stack.

The grammar reads such an object as `{` list `}` with `list: M_i | M_i sep list` (right-recursive, so every
member written stays on the stack) and `M_i: tag_i <key i> : <value i>`, one M_i per distinct member (a
key and its value's schema), `tag_i` an empty rule. The LALR table reduces `tag_i` when the lexer hands it
member i's first terminal, before shifting it: there a guard walks the stack down through the members
written so far (their M_j nodes and separators) and vetoes a key written twice, or a member no branch of
the union allows beside the ones written. Reducing `list: M_i` (the last member, once per object) checks
that some branch still allowed has all its required keys. A vetoed terminal is not acceptable there, so
the lexer never reads it and the mask leaves it out: no dead ends, no blow-up (2^n sets written are
never built; the lexers built are those of the sets a decode visits).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .lalr import LalrTable, Stack

Guard = Callable[[LalrTable, Stack, int], bool]


@dataclass(frozen=True, slots=True)
class MemberCheck:
    """One checked object (a union of `len(required)` branches) by its rules' names."""
    list_rule: str
    sep_rule: str
    members: dict[str, tuple[int, int]]  # member rule -> (key id, -1 for an undeclared key; branches allowing it)
    tags: dict[str, str]  # tag rule -> its member rule
    required: tuple[int, ...]  # per branch: the key ids it requires, as bits


def guards(checks: tuple[MemberCheck, ...]) -> dict[str, Guard]:
    out: dict[str, Guard] = {}
    for check in checks:
        for tag, member in check.tags.items():
            out[tag] = _tag_guard(check, *check.members[member])
        out[check.list_rule] = _end_guard(check)
    return out


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
            branches &= allowed
        stack = table.parent(stack)
    return keys, branches


def _tag_guard(check: MemberCheck, key: int, allowed: int) -> Guard:
    def guard(table: LalrTable, stack: Stack, size: int) -> bool:
        keys, branches = _written(check, table, stack)
        return not (key >= 0 and keys >> key & 1) and bool(branches & allowed)
    return guard


def _end_guard(check: MemberCheck) -> Guard:
    def guard(table: LalrTable, stack: Stack, size: int) -> bool:
        if size != 1:  # `list: M sep list`: the last member's `list: M` checked already
            return True
        keys, branches = _written(check, table, stack)
        return any(branches >> b & 1 and keys & need == need for b, need in enumerate(check.required))
    return guard
