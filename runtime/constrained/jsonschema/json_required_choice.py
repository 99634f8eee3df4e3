"""`anyOf` / `oneOf` over `required` lists only ("at least one of these properties"), as branches that
no object matches twice.

A union whose branches overlap is ambiguous: harmless in a DFA, but a conflict for the LALR engine once
the object holds a recursive value. Branch i keeps its own required names and, for each earlier branch
j (every other branch, for oneOf), leaves out one of j's names that i does not require, chosen in a
fixed order so the choices exclude each other too. For anyOf the branches then still cover the same
objects; for oneOf they cover exactly the objects that match one branch.
"""
from __future__ import annotations

from itertools import product
from typing import Any

from .schema_merge import MAX_BRANCHES, normalize


def required_choice(key: str, subs: list[Any], formats: frozenset[str]) -> list[dict] | None:
    """Disjoint branches equivalent to `key` over `subs`, when every branch says only `required`;
    None otherwise, or when the branches would multiply past MAX_BRANCHES."""
    found = [_required_only(sub, formats) for sub in subs]
    sets = [s for s in found if s is not None]
    if len(found) < 2 or len(sets) < len(found):
        return None
    out: list[dict] = []
    for i, own in enumerate(sets):
        others = sets[:i] if key == "anyOf" else sets[:i] + sets[i + 1:]
        missing = [[n for n in other if n not in own] for other in others]
        if any(not m for m in missing):
            continue  # every object this branch allows, another branch already covers (or, for oneOf, shares)
        choices = [[(m[:k], m[k]) for k in range(len(m))] for m in missing]
        combos = 1
        for c in choices:
            combos *= len(c)
        if len(out) + combos > MAX_BRANCHES:
            return None
        for picked in product(*choices):
            branch = _branch(own, picked)
            if branch is not None:
                out.append(branch)
    return out or None


def _required_only(sub: object, formats: frozenset[str]) -> list[str] | None:
    if not isinstance(sub, dict):
        return None
    s = normalize(sub, formats)
    names = s.get("required")
    if set(s) != {"required"} or not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        return None
    return list(dict.fromkeys(names))


def _branch(own: list[str], picked: tuple[tuple[list[str], str], ...]) -> dict | None:
    """`own` required, plus each pick's names required and its one name absent; None if they clash."""
    required = list(own)
    absent: list[str] = []
    for present, gone in picked:
        required += [n for n in present if n not in required]
        absent.append(gone)
    if set(required) & set(absent):
        return None
    return {"required": required, "properties": {n: False for n in absent}}
