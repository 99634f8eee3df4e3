"""Which arrays of a JSON instance must hold distinct items (`uniqueItems`), found by their place in the
instance: the schema walked along the instance path, as the output is read (unique_items.py enforces it).

A place ("loc") is the set of alternatives the schema leaves there, each a conjunction of subschemas:
`allOf` and `$ref` add conjuncts, `anyOf` / `oneOf` split alternatives (as do `then` / `else` and dependent
schemas, whose conditions the walk does not judge: _conditional_branches), and a member or an item takes,
per conjunct, `properties` / `patternProperties` / `additionalProperties` or `prefixItems` / `items` /
`additionalItems`. An array there must hold distinct items when every alternative that admits an array
has a conjunct with `uniqueItems: true`. Everything this walk leaves out (`not`, an `if` condition's own
keywords, a `$ref` cycle met without descending, a union past MAX_ALTERNATIVES) only drops
conjuncts or whole places (no alternatives' demands): fewer arrays are held to distinct items, never more,
so no valid output is refused. Where a union leaves an array's uniqueness open, it is reported.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

from .json_refs import RefResolver

Alt = frozenset[int]  # a conjunction of subschemas (indices into UniqueWalk.schemas)
Loc = frozenset[Alt]  # a place's alternatives
TOP = 0  # the loc of a place without constraints: one alternative, no conjuncts
MAX_ALTERNATIVES = 32  # past this, a place is taken as unconstrained (nothing enforced below it, reported)
MAX_LOCS = 20_000  # places numbered per schema; past it, new places are unconstrained
MAX_MEMO = 65_536  # (place, member name) steps kept
EXPLORE_LOCS = 2_000  # places the compile-time report visits
_DATA_KEYWORDS = frozenset({"enum", "const", "default", "examples", "example"})
_OWN_KEYWORDS = frozenset({"uniqueItems", "properties", "patternProperties", "additionalProperties", "items",
                           "prefixItems", "additionalItems", "type"})


@dataclass(frozen=True, slots=True)
class _Sample:
    """A member name for the compile-time report: one that matches `pattern` alone (None: no pattern, and
    no declared property)."""
    pattern: str | None


@lru_cache(maxsize=4096)
def _compiled(pattern: str) -> re.Pattern | None:
    try:
        return re.compile(pattern, re.ASCII)  # ECMA-262's \d, \w, \s are ASCII
    except (re.error, RecursionError):
        return None


def _matches(pattern: str, key: str | _Sample) -> bool | None:
    """Whether a patternProperties pattern matches `key` (None: unknown, a pattern Python cannot read)."""
    if isinstance(key, _Sample):
        return key.pattern == pattern
    rx = _compiled(pattern)
    return None if rx is None else rx.search(key) is not None


def _product(a: Loc, b: Loc) -> Loc:
    return frozenset(x | y for x in a for y in b)


def _conditional_branches(s: dict) -> list[tuple[object, ...]]:
    """The schemas that apply to an instance of `s` under a condition the walk cannot judge, each as its choice of
    branches: `then` or `else` (whichever `if` picks; a missing one is true), and each dependent schema or nothing
    (as its property is present or not). Taken as unions, an array they ask distinct items of is held to it only
    where every branch asks it, and otherwise reported (a `uniqueItems` under `then` alone was neither)."""
    out: list[tuple[object, ...]] = []
    if "if" in s and ("then" in s or "else" in s):
        out.append((s.get("then", True), s.get("else", True)))
    for word in ("dependentSchemas", "dependencies"):
        deps = s.get(word)
        for dep in deps.values() if isinstance(deps, dict) else ():
            if isinstance(dep, dict):  # a list is dependentRequired's: names, no schema
                out.append((dep, True))
    return out


class UniqueWalk:
    def __init__(self, root: object):
        self.refs = RefResolver(root)
        self.schemas: list[dict] = []
        self.paths: list[str] = []
        self._index: dict[int, int] = {}
        self._register(root, "#")
        self.unique = [i for i, s in enumerate(self.schemas) if s.get("uniqueItems") is True]
        self.incomplete = False  # some place was taken as unconstrained (a cap): report every uniqueItems
        self._expanded: dict[int, Loc] = {}
        self._expanding: set[int] = set()
        self.locs: list[Loc] = [frozenset({frozenset()})]
        self._loc_ids: dict[Loc, int] = {self.locs[TOP]: TOP}
        self._members: dict[tuple[int, object], int] = {}
        self._items: dict[tuple[int, int], int] = {}
        self._demand: dict[int, bool] = {}
        self.max_prefix = max((len(s[k]) for s in self.schemas for k in ("prefixItems", "items")
                               if isinstance(s.get(k), list)), default=0)
        self.root = self._loc(self._expand(root)) if self.unique else TOP

    def _register(self, node: object, path: str) -> None:
        """Every subschema of the document by its JSON pointer (reports name them)."""
        if isinstance(node, list):
            for i, x in enumerate(node):
                self._register(x, f"{path}/{i}")
            return
        if not isinstance(node, dict) or id(node) in self._index:
            return
        self._index[id(node)] = len(self.schemas)
        self.schemas.append(node)
        self.paths.append(path)
        for key, value in node.items():
            if key not in _DATA_KEYWORDS:
                self._register(value, f"{path}/{key.replace('~', '~0').replace('/', '~1')}")

    # ---- places ---------------------------------------------------------------------------------
    def _loc(self, alts: Loc) -> int:
        hit = self._loc_ids.get(alts)
        if hit is None:
            if len(self.locs) >= MAX_LOCS:
                self.incomplete = True
                return TOP
            hit = self._loc_ids[alts] = len(self.locs)
            self.locs.append(alts)
        return hit

    def _expand(self, s: object) -> Loc:
        """A subschema's alternatives (True / {}: one, unconstrained; False: none)."""
        if not isinstance(s, dict):
            return frozenset() if s is False else self.locs[TOP]
        key = id(s)
        hit = self._expanded.get(key)
        if hit is not None:
            return hit
        if key in self._expanding or key not in self._index:  # a cycle without descending: dropped
            return self.locs[TOP]
        self._expanding.add(key)
        try:
            alts: Loc = frozenset({frozenset({self._index[key]}) if _OWN_KEYWORDS & s.keys() else frozenset()})
            if "$ref" in s:
                try:
                    alts = _product(alts, self._expand(self.refs.resolve(s["$ref"], "#")[1]))
                except ValueError:
                    pass  # the compile refuses it; nothing is enforced through it
            for member in s.get("allOf", ()) if isinstance(s.get("allOf"), list) else ():
                alts = _product(alts, self._expand(member))
            for word in ("anyOf", "oneOf"):
                if isinstance(s.get(word), list):
                    alts = _product(alts, frozenset().union(*(self._expand(m) for m in s[word])))
                if len(alts) > MAX_ALTERNATIVES:
                    break
            for branches in _conditional_branches(s):  # a choice of demands: held where every branch holds them
                if len(alts) > MAX_ALTERNATIVES:
                    break
                alts = _product(alts, frozenset().union(*(self._expand(b) for b in branches)))
        finally:
            self._expanding.discard(key)
        if len(alts) > MAX_ALTERNATIVES:
            self.incomplete = True
            alts = self.locs[TOP]
        self._expanded[key] = alts
        return alts

    def _admits(self, alt: Alt, kind: str) -> bool:
        for i in alt:
            t = self.schemas[i].get("type")
            if isinstance(t, str) and t != kind or isinstance(t, list) and kind not in t:
                return False
        return True

    def _step(self, loc: int, subschemas) -> int:  # noqa: ANN001 - (Alt -> its conjuncts' subschemas)
        out: set[Alt] = set()
        for alt in self.locs[loc]:
            acc: Loc = self.locs[TOP]
            for sub in subschemas(alt):
                acc = _product(acc, self._expand(sub))
                if len(acc) > MAX_ALTERNATIVES:
                    break
            out |= acc
            if len(out) > MAX_ALTERNATIVES:
                self.incomplete = True
                return TOP
        return self._loc(frozenset(out))

    def member(self, loc: int, key: str | _Sample) -> int:
        """The place of the member named `key` of an object at `loc`."""
        if loc == TOP:
            return TOP
        memo = (loc, key)
        hit = self._members.get(memo)
        if hit is None:
            hit = self._step(loc, lambda alt: self._member_schemas(alt, key) if self._admits(alt, "object") else [False])
            if len(self._members) < MAX_MEMO:
                self._members[memo] = hit
        return hit

    def _member_schemas(self, alt: Alt, key: str | _Sample) -> list:
        subs: list = []
        for i in alt:
            s = self.schemas[i]
            props = s.get("properties")
            declared = isinstance(props, dict) and isinstance(key, str) and key in props
            if declared:
                subs.append(props[key])  # type: ignore[index]
            matched, unknown = False, False
            patterns = s.get("patternProperties")
            for pattern, sub in patterns.items() if isinstance(patterns, dict) else ():
                found = _matches(pattern, key)
                unknown |= found is None
                if found:
                    subs.append(sub)
                    matched = True
            if not declared and not matched and not unknown and "additionalProperties" in s:
                subs.append(s["additionalProperties"])
        return subs

    def item(self, loc: int, index: int) -> int:
        """The place of item `index` of an array at `loc`."""
        if loc == TOP:
            return TOP
        memo = (loc, min(index, self.max_prefix))
        hit = self._items.get(memo)
        if hit is None:
            hit = self._items[memo] = self._step(
                loc, lambda alt: self._item_schemas(alt, index) if self._admits(alt, "array") else [False])
        return hit

    def _item_schemas(self, alt: Alt, index: int) -> list:
        subs = []
        for i in alt:
            s = self.schemas[i]
            prefix, items = s.get("prefixItems"), s.get("items")
            if isinstance(prefix, list):
                sub = prefix[index] if index < len(prefix) else items
            elif isinstance(items, list):
                sub = items[index] if index < len(items) else s.get("additionalItems")
            else:
                sub = items
            if sub is not None:
                subs.append(sub)
        return subs

    def demand(self, loc: int) -> bool:
        """Whether an array at `loc` must hold distinct items: every alternative admitting an array says so."""
        hit = self._demand.get(loc)
        if hit is None:
            alts = [a for a in self.locs[loc] if self._admits(a, "array")]
            hit = self._demand[loc] = bool(alts) and all(
                any(self.schemas[i].get("uniqueItems") is True for i in a) for a in alts)
        return hit

    # ---- the compile-time report ----------------------------------------------------------------
    def report(self) -> tuple[str, ...]:
        """"uniqueItems at <path>" for each such keyword some reachable array may not be held to: a union
        whose other branches allow repeated items, or a place past a cap."""
        if not self.unique:
            return ()
        names = sorted({k for s in self.schemas if isinstance(s.get("properties"), dict) for k in s["properties"]})
        keys: list[str | _Sample] = [*names, _Sample(None), *sorted(
            {_Sample(p) for s in self.schemas if isinstance(s.get("patternProperties"), dict)
             for p in s["patternProperties"]}, key=lambda x: x.pattern or "")]
        enforced: set[int] = set()
        loose: set[int] = set()
        seen, todo = {self.root}, [self.root]
        while todo:
            if len(seen) > EXPLORE_LOCS:
                self.incomplete = True
                break
            loc = todo.pop()
            alts = [a for a in self.locs[loc] if self._admits(a, "array")]
            (enforced if self.demand(loc) else loose).update(i for a in alts for i in a)
            nxt = []
            if any(self._admits(a, "object") for a in self.locs[loc]):
                nxt += [self.member(loc, k) for k in keys]
            if alts:
                nxt += [self.item(loc, i) for i in range(self.max_prefix + 1)]
            for n in nxt:
                if n not in seen:
                    seen.add(n)
                    todo.append(n)
        return tuple(f"uniqueItems at {self.paths[i]}" for i in self.unique
                     if i in loose or (self.incomplete and i not in enforced))

    @property
    def enforces(self) -> bool:
        """Whether some array of some instance is held to distinct items (else no scan is needed)."""
        return any(self.demand(loc) for loc in range(len(self.locs)))
