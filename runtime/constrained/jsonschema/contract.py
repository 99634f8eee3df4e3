"""What the keyword modules (json_arrays, json_objects, json_combinators, json_not, json_scalar_schemas)
may ask of the schema compiler that calls them: its recursion into subschemas, its token and bracket
builders, and the state they share (rules, `$ref`s, exact mode).

A leaf: the keyword modules import this instead of json_schema, which imports them, so no cycle."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, TypeVar

from ..grammar.member_check import MemberCheck
from ..regex import regex_ast as ra
from .json_refs import RefResolver

T = TypeVar("T")
# compiles one alternative on demand (it may raise Unsatisfiable); called with no arguments: `...` as the
# makers are lambdas that bind their loop values as default arguments
Maker = Callable[..., ra.Node]


@dataclass(frozen=True, slots=True)
class LazyObject:
    """An object whose declared members take any order, each at most once, built as decoding reaches it
    (object_dispatch): an automaton over the set of members written, of which a decode visits a few."""
    marker: str  # the character that stands for the object in the schema's regex
    keys: tuple[ra.Node, ...]  # declared members' quoted keys
    values: tuple[ra.Node, ...]  # ... and what follows each key: the colon and the value
    required: int  # bit i: declared member i is required
    extra_keys: tuple[ra.Node, ...]  # undeclared members' kinds (patternProperties, additionalProperties)
    extra_values: tuple[ra.Node, ...]
    ws: ra.Node  # whitespace between tokens
    path: str  # where the schema declares it


class KeepsOrder(Exception):
    """The schema would keep an object in declared order where the caller asked for any order only
    (compile_json_schema's `any_order`): not a ValueError, so no fallback inside the compile takes it for a refusal."""


class SchemaCompiler(Protocol):
    relaxed: frozenset[str]  # keywords left unenforced where they cannot be enforced (opt-in)
    strict: bool  # OpenAI's strict form: declared properties in order, no undeclared ones unless allowed
    strict_root: bool  # ... for the whole schema (else only where a oneOf's branches may overlap)
    unenforced: list[str]  # ... and where they were: "<keyword> at <path>", reported with the constraint
    rule_size: int | None  # objects, arrays and strings larger than this become rules (None: never)
    exact_depth: int  # >0 inside oneOf / not / enum, where sub-languages must stay regular
    bounded_any: int  # >0: any value nests at most a few levels deep (a regex: an under-approximation)
    pending_firsts: dict[str, ra.Ranges | None]  # rules being compiled: first characters by type
    refs: RefResolver
    rules: dict[str, ra.Node]
    merged_names: dict[str, str]  # rules for merged allOfs that recurse, by content
    lazy: list[LazyObject] | None  # objects built as decoding reaches them (None: none, e.g. in a grammar)
    not_lazy: frozenset[str]  # ... but not these (paths): they keep declared order
    ws: ra.Node  # whitespace between tokens
    any_undeclared: bool  # undeclared properties' values: any JSON (a rule), else bounded
    checked: bool  # objects past the eager any-order automaton are checked by the grammar (json_checked)
    member_checks: list[MemberCheck]  # ... those made so far
    checked_objects: dict[tuple, tuple[ra.Node, MemberCheck]]  # ... by their members and required keys
    shapes: dict[ra.Node, tuple]  # objects' json_checked.ObjectShapes (a checked union's: its branches'), by node
    fallbacks: dict[ra.Node, Callable[[], ra.Node]]  # checked objects' declared-order form, by their node

    def compile(self, schema: object, path: str) -> ra.Node:
        """A subschema's language; `path` (a JSON pointer) names it in errors."""
        ...

    def keeps_order(self, report: str) -> None:
        """Reports an object kept in declared order (`report`, "property order ..."); raises KeepsOrder where the
        caller asked for any order only."""
        ...

    def exact(self, make: Callable[[], T]) -> T:
        """`make()` with no subschema turned into a rule (its language is intersected or subtracted)."""
        ...

    def punct(self, c: str) -> ra.Node: ...

    def boundary(self) -> ra.Node:
        """An empty rule: a place where the grammar's lexer must end one lexeme and start the next."""
        ...

    def undeclared_value(self) -> ra.Node:
        """The value of a property that the schema says nothing about (no `additionalProperties`)."""
        ...

    def bounded_value(self) -> ra.Node:
        """Any JSON value nesting at most a few levels deep, as one regex (json_schema.UNDECLARED_VALUE_DEPTH)."""
        ...

    def bracketed(self, opening: str, body: ra.Node, closing: str) -> ra.Node: ...

    def separator(self, members_apart: bool) -> ra.Node: ...

    def union(self, makers: list[Maker], path: str) -> ra.Node:
        """The alternatives that some value satisfies; unsatisfiable ones drop out."""
        ...

    def alternatives(self, nodes: list[ra.Node], makers: list[Maker]) -> ra.Node: ...

    def named(self, key: str, target: object, name: str, path: str) -> ra.Node:
        """`target` compiled once per `key`; met again inside its own compilation, it is the rule `name`."""
        ...
