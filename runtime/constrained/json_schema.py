"""JSON Schema -> a grammar: a regex tree per rule, with `Ref`s where schemas recurse.

Strict by default, as xgrammar's strict mode: objects emit their declared properties in schema order
(required ones always, optional ones maybe) and add undeclared ones only where `patternProperties` or
an explicit `additionalProperties` allows them (or the object declares nothing at all). Numbers and
strings get exact regexes for their bounds, lengths, patterns and formats. Keywords that only annotate
are ignored, as the specification says; a constraint that cannot be enforced is refused, never dropped.
A schema without recursion comes out as one regular expression (the fast DFA path); a recursive one
(a `$ref` cycle, or an unconstrained value, which is any JSON) comes out as rules for the LALR engine.
Whitespace between tokens follows one finite pattern; compact (none) by default.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from decimal import Decimal
from typing import Any

from . import regex_ast as ra
from .automaton import compile_dfa, difference, exactly_one, intersection
from .json_objects import object_node
from .json_scalars import (FORMATS, STRING_CHARS, as_decimal, compiled_or_nothing, const_text, constrained_string, integer_node,
                           multiples_of, number_node, pattern_body, quoted, spellings, string_body, string_node)
from .json_disjoint import provably_disjoint
from .json_refs import RefResolver
from .json_required_choice import required_choice
from .json_unions import Container, merged_body
from .regex_parser import parse_regex
from .schema_merge import JSON_TYPES, MAX_BRANCHES, Clash, Unsatisfiable, conjoin_all, conjoin_sub, normalize

ANY_VALUE = "json_value"  # the rule for an unconstrained JSON value
LEXEME_BOUNDARY = "lexeme_boundary"
JSON_REGEX_MAX_SIZE = 20_000  # a schema whose regex is larger (in NFA states) compiles as a grammar
JSON_RULE_SIZE = 2_000  # ... where every object, array or string larger than this is a rule of its own
STRING_CHUNK = 512  # ... and a string longer than twice this many characters is read in chunks of it
MAX_UNIQUE_VALUES = 8
RELAXABLE = frozenset({"uniqueItems"})  # uniqueItems is enforced over at most this many item values (2^n states)
KNOWN_FORMATS = frozenset(FORMATS)
_UNSUPPORTED = ("contains", "$dynamicRef", "$recursiveRef")
JSON_WHITESPACE = frozenset(b" \t\n\r")


@dataclass(slots=True)
class JsonGrammar:
    root: ra.Node
    rules: dict[str, ra.Node] = field(default_factory=dict)  # empty: `root` is a plain regex


def schema_to_dict(schema: Any) -> dict | bool:
    """A schema given as a dict, a JSON string, or a pydantic model class, as a plain dict."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"json_schema is not valid JSON: {e}") from None
    if not isinstance(schema, dict | bool):
        raise ValueError("json_schema must be a dict, a JSON string, or a pydantic model class, "
                         f"got {type(schema).__name__}")
    return schema


def whitespace_node(pattern: str | None) -> ra.Node:
    """The whitespace allowed between JSON tokens: none (compact) or a finite pattern of JSON blanks."""
    if pattern is None:
        return ra.EMPTY
    node = parse_regex(pattern)
    dfa = compile_dfa([node])
    if not dfa.is_finite():
        raise ValueError(f"JSON whitespace pattern {pattern!r} must match a bounded length (e.g. '[ ]?')")
    used = {int(b) for b in range(256) if (dfa.trans[:, b] >= 0).any()}
    if not used <= JSON_WHITESPACE:
        raise ValueError(f"JSON whitespace pattern {pattern!r} may only match spaces, tabs and newlines")
    return node


def relaxed_keywords(relaxed: Any) -> frozenset[str]:
    """The keywords a caller lets go unenforced where they cannot be enforced (only `uniqueItems`),
    as names or one comma-separated string."""
    if isinstance(relaxed, str):
        relaxed = [k.strip() for k in relaxed.split(",") if k.strip()]
    out = frozenset(relaxed or ())
    if not out <= RELAXABLE:
        raise ValueError(f"json_schema relaxed keywords must be among {sorted(RELAXABLE)}, got {sorted(out)}")
    return out


def compile_json_schema(schema: Any, whitespace: str | None = None, relaxed: Any = ()) -> JsonGrammar:
    """One regex when the schema is small and regular; else a grammar whose large objects and arrays
    are rules of their own, so that each lexer DFA stays the size of one such piece. `relaxed` names
    keywords to leave unenforced where they cannot be enforced (opt-in; by default they are refused)."""
    root = schema_to_dict(schema)
    ws = whitespace_node(whitespace)
    relax = relaxed_keywords(relaxed)
    try:
        compiler = _SchemaCompiler(root, ws, relax)
        node = compiler.compile(root, "#")
        small = ra.size(node) <= JSON_REGEX_MAX_SIZE and all(ra.size(r) <= JSON_REGEX_MAX_SIZE
                                                             for r in compiler.rules.values())
        if small and not compiler.rules:
            return JsonGrammar(node, {})
        compiler = _SchemaCompiler(root, ws, relax, rule_size=None if small else JSON_RULE_SIZE)
        node = compiler.compile(root, "#")
    except Unsatisfiable as e:
        raise ValueError(f"json_schema: no value can satisfy it ({e})") from None
    except RecursionError:
        raise ValueError("json_schema nests too deeply to compile") from None
    except (TypeError, AttributeError) as e:  # a keyword whose value has the wrong JSON type
        raise ValueError(f"json_schema is malformed: {e}") from None
    return JsonGrammar(node, compiler.rules)


class _SchemaCompiler:
    def __init__(self, root: dict | bool, ws: ra.Node, relaxed: frozenset[str] = frozenset(),
                 rule_size: int | None = None):
        self.relaxed = relaxed
        self._split_all = 0  # >0: every bracket and member is a lexeme of its own (see split_alike)
        self.rule_size = rule_size  # objects, arrays and strings larger than this become rules (None: never)
        self._pieces: dict[str, ra.Node] = {}  # compiled subschemas (rules among them), by schema text
        self._piece_count = 0
        self._exact = 0  # >0 inside oneOf / not / enum, where sub-languages must stay regular
        self._pending_firsts: dict[str, ra.Ranges | None] = {}  # rules being compiled: first characters by type
        self.refs = RefResolver(root)
        self.ws = ws
        self.rules: dict[str, ra.Node] = {}
        self._inline: dict[str, ra.Node] = {}
        self._open: set[str] = set()
        self._recursive: set[str] = set()
        self._merged_names: dict[str, str] = {}  # rules for merged allOfs that recurse, by content
        self._containers: dict[ra.Node, Container] = {}  # each bracketed node, by itself: unions merge them

    # ---- tokens -------------------------------------------------------------------------------
    def punct(self, c: str) -> ra.Node:
        return ra.seq(self.ws, ra.literal(c), self.ws)

    def exact(self, make):
        """`make()` with no subschema turned into a rule (its language is intersected or subtracted)."""
        self._exact += 1
        try:
            return make()
        finally:
            self._exact -= 1

    def boundary(self) -> ra.Node:
        """An empty rule: a place where the grammar's lexer must end one lexeme and start the next."""
        self.rules.setdefault(LEXEME_BOUNDARY, ra.EMPTY)
        return ra.Ref(LEXEME_BOUNDARY)

    def bracketed(self, opening: str, body: ra.Node, closing: str) -> ra.Node:
        """`body` in brackets; around a rule (or where asked), the brackets are lexemes of their own."""
        split = self._split_all or bool(ra.refs(body) - {LEXEME_BOUNDARY})
        cut = self.boundary() if split and not self._exact else ra.EMPTY
        node = ra.seq(ra.literal(opening), self.ws, cut, body, cut, self.ws, ra.literal(closing))
        self._containers[node] = Container(opening, body, closing)
        return node

    def merge_containers(self, nodes: list[ra.Node]) -> list[ra.Node]:
        """Alternatives that are objects (or arrays) holding rules, as one object (or array) whose body
        reads the union of theirs (json_unions): an LALR parser cannot carry two readings of one text."""
        if self._exact:
            return nodes
        opened = [self._containers.get(self.rules.get(n.name, n) if isinstance(n, ra.Ref) else n) for n in nodes]
        out, merged = [], set()
        for i, node in enumerate(nodes):
            if i in merged:
                continue
            box = opened[i]
            group = [j for j, other in enumerate(opened) if j >= i and box and other and other.opening == box.opening]
            body = None
            if len(group) > 1 and any(ra.refs(opened[j].body) for j in group):
                body = merged_body([opened[j].body for j in group])
            if body is None:
                out.append(node)
                continue
            merged.update(group)
            out.append(self.bracketed(box.opening, body, box.closing))
        return out

    def separator(self, members_apart: bool) -> ra.Node:
        """The comma between members or items; where they hold rules (or where asked), a lexeme starts
        at it: one lexeme spanning an optional member would read on greedily into the next member's
        key and fail where that member is absent."""
        comma = self.punct(",")
        return ra.seq(self.boundary(), comma) if (members_apart or self._split_all) and not self._exact else comma

    def split_alike(self, nodes: list[ra.Node], remake) -> list[ra.Node]:
        """Alternatives where one holds a rule and another, starting alike, is one lexeme: the lexer
        reads the longest match and never backs up, so the latter is remade split the same way."""
        ruled = [_first_chars(n, self.rules, set(), self._pending_firsts) for n in nodes if ra.refs(n)]
        if not ruled or self._exact:
            return nodes
        out = []
        for i, node in enumerate(nodes):
            first = _first_chars(node, self.rules, set(), self._pending_firsts)
            if not ra.refs(node) and any(f is None or first is None or ra.intersect(f, first) for f in ruled):
                self._split_all += 1
                try:
                    node = remake(i)
                finally:
                    self._split_all -= 1
            out.append(node)
        return out

    # ---- dispatch -----------------------------------------------------------------------------
    def compile(self, schema: Any, path: str) -> ra.Node:
        if schema is True:
            return self.any_value()
        if schema is False:
            raise Unsatisfiable(f"the schema at {path} is `false`")
        if not isinstance(schema, dict):
            raise ValueError(f"json_schema at {path} must be an object or a boolean, got {schema!r}")
        if self._exact:
            return self._compile(schema, path)
        key = ("split:" if self._split_all else "") + json.dumps(schema, sort_keys=True, default=repr)
        hit = self._pieces.get(key)
        if hit is not None:
            return hit
        # a container around a rule is a rule too, one per schema: two alternatives that share it
        # (anyOf branches alike up to a late member) then parse it as one, where two copies of its
        # rules would be an LALR conflict
        node = self.piece(self._compile(schema, path), ruled=True)
        self._pieces[key] = node
        return node

    def piece(self, node: ra.Node, ruled: bool = False) -> ra.Node:
        """`node` as a rule of its own where it is large (or, with `ruled`, holds a rule) and lexes alone."""
        large = self.rule_size is not None and ra.size(node) > self.rule_size
        if not (large or (ruled and ra.refs(node) and not isinstance(node, ra.Ref))) or not _lexes_alone(node):
            return node
        name = f"piece_{self._piece_count}"  # not len(_pieces): a recursion may have cached this key
        self._piece_count += 1
        self.rules[name] = node
        return ra.Ref(name)

    def _compile(self, schema: dict, path: str) -> ra.Node:
        s = normalize(schema, KNOWN_FORMATS)
        for key in _UNSUPPORTED:
            if key in s:
                raise ValueError(f"json_schema keyword {key!r} at {path} is not supported")
        if not s:
            return self.any_value()
        if "$ref" in s:
            return self.with_ref(s, path)
        if "allOf" in s:
            return self.all_of(s, path)
        if "dependentRequired" in s or "dependentSchemas" in s:
            return self.compile(_dependencies_as_all_of(s, path), path)
        if "if" in s:
            rest = {k: v for k, v in s.items() if k not in ("if", "then", "else")}
            cond = [{"allOf": [s["if"], s.get("then", True)]}, {"allOf": [{"not": s["if"]}, s.get("else", True)]}]
            return self.compile({**rest, "allOf": [{"anyOf": cond}]}, path)
        for key in ("anyOf", "oneOf"):
            if key in s:
                return self.combinator(key, s, path)
        if "not" in s:
            return self.negated(s, path)
        if "enum" in s or "const" in s:
            return self.enum(s, path)
        types = s.get("type", _infer_type(s))
        if types is None:
            return self.any_value()
        types = [types] if isinstance(types, str) else types
        if not isinstance(types, list):  # e.g. {"type": 7}
            raise ValueError(f"json_schema type at {path} must be a type name or a list of them, got {types!r}")
        bad = [t for t in types if t not in JSON_TYPES]
        if bad or not types:
            raise ValueError(f"json_schema type at {path} must be one of {JSON_TYPES}, got {s['type']!r}")
        if "integer" in types and "number" in types:
            types = [t for t in types if t != "integer"]
        # each type its own piece where large: a string beside null is one lexeme, not the whole object
        return self.union([lambda t=t: self.piece(self.typed(t, s, path)) if len(types) > 1 else self.typed(t, s, path)
                           for t in types], path)

    def union(self, makers: list, path: str) -> ra.Node:
        """The alternatives that some value satisfies; unsatisfiable ones drop out."""
        nodes, kept, last = [], [], None
        for make in makers:
            try:
                nodes.append(make())
                kept.append(make)
            except Unsatisfiable as e:
                last = e
        if not nodes:
            raise last or Unsatisfiable(f"no alternative at {path}")
        return self.alternatives(nodes, kept)

    def alternatives(self, nodes: list[ra.Node], makers: list) -> ra.Node:
        """Alternatives that each match values apart, or where two match a value, either may."""
        nodes = self.split_alike(nodes, lambda i: makers[i]())
        return ra.alt(*self.merge_containers(nodes))

    def typed(self, t: str, s: dict, path: str) -> ra.Node:
        if t == "object":
            return self.object(s, path)
        if t == "array":
            return self.array(s, path)
        if t == "string":
            return self.string(s, path)
        if t in ("integer", "number"):
            return self.number(t, s, path)
        if t == "boolean":
            return ra.alt(ra.literal("true"), ra.literal("false"))
        return ra.literal("null")

    # ---- references -----------------------------------------------------------------------------
    def ref(self, ref: Any, path: str) -> ra.Node:
        key, target = self.refs.resolve(ref, path)
        return self.named(key, target, self._rule_name(key), key)

    def named(self, key: str, target: Any, name: str, path: str) -> ra.Node:
        """`target` compiled once per `key`; met again inside its own compilation, it is the rule `name`."""
        if key in self._inline:
            return self._inline[key]
        if key in self._open:
            self._recursive.add(key)
            return ra.Ref(name)
        self._open.add(key)
        self._pending_firsts[name] = _type_first_chars(target)
        try:
            body = self.compile(target, path)
        finally:
            self._open.discard(key)
        if key in self._recursive:
            self.rules[name] = body
            node = ra.Ref(name)
        else:
            node = body
        self._inline[key] = node
        return node

    def with_ref(self, s: dict, path: str) -> ra.Node:
        rest = {k: v for k, v in s.items() if k != "$ref"}
        if not rest:
            return self.ref(s["$ref"], path)
        return self.all_of({**rest, "allOf": [{"$ref": s["$ref"]}]}, path)

    def _rule_name(self, ref: str) -> str:
        slug = "".join(c if c.isalnum() else "_" for c in ref[1:]).strip("_").lower()
        return f"ref_{slug}" if slug else "ref_root"

    # ---- combinators --------------------------------------------------------------------------
    def all_of(self, s: dict, path: str) -> ra.Node:
        """Merges the parts keyword by keyword; parts that do not merge are intersected as languages.
        A merged schema that inlines a `$ref` is compiled once per content, as a rule where it recurs:
        a cycle through `$ref`s with sibling keywords would otherwise inline itself without end."""
        inlined: list[str] = []
        parts = self._flatten(s, path, set(), inlined)
        try:
            merged = conjoin_all(parts)
        except Clash:
            return self._intersect(parts, path)
        if not inlined:
            return self.compile(merged, path)
        key = "allOf:" + json.dumps(merged, sort_keys=True, default=repr)
        name = self._merged_names.setdefault(key, f"all_of_{len(self._merged_names)}")
        return self.named(key, merged, name, path)

    def _flatten(self, schema: Any, path: str, seen: set[str], inlined: list[str]) -> list[Any]:
        """The conjuncts of a schema: `allOf` members and inlined `$ref` targets (listed in `inlined`),
        normalized."""
        if not isinstance(schema, dict):
            return [schema]
        s = normalize(schema, KNOWN_FORMATS)
        out: list[Any] = []
        if "$ref" in s:
            key, target = self.refs.resolve(s["$ref"], path)
            if key in seen:
                raise ValueError(f"json_schema at {path}: $ref {s['$ref']!r} is an allOf member of itself")
            inlined.append(key)
            out += self._flatten(target, key, seen | {key}, inlined)
        subs = s.get("allOf", [])
        if not isinstance(subs, list):
            raise ValueError(f"json_schema allOf at {path} must be a list")
        for i, sub in enumerate(subs):
            out += self._flatten(sub, f"{path}/allOf/{i}", seen, inlined)
        rest = {k: v for k, v in s.items() if k not in ("$ref", "allOf")}
        return out + [rest] if rest or not out else out

    def _intersect(self, parts: list[Any], path: str) -> ra.Node:
        nodes = self.exact(lambda: [self.compile(p, path) for p in parts])
        if any(ra.refs(n) for n in nodes):
            raise ValueError(f"json_schema allOf at {path}: its subschemas do not merge and one is recursive")
        node = compiled_or_nothing(intersection(nodes))
        if node == ra.NOTHING:
            raise Unsatisfiable(f"the allOf at {path} has no common value")
        return node

    def combinator(self, key: str, s: dict, path: str) -> ra.Node:
        subs = s[key]
        if not isinstance(subs, list) or not subs:
            raise ValueError(f"json_schema {key} at {path} must be a non-empty list")
        rest = {k: v for k, v in s.items() if k != key}
        subs = required_choice(key, subs, KNOWN_FORMATS) or subs
        branches = [conjoin_sub(rest, sub) if rest else sub for sub in subs]
        if key == "anyOf":
            return self.union([lambda i=i, b=b: self.compile(b, f"{path}/anyOf/{i}") for i, b in enumerate(branches)],
                              path)
        nodes, kept = self._branches(branches, path)
        if self._disjoint(nodes, kept, path):
            return self.alternatives(nodes, [lambda b=b, i=i: self.compile(b, f"{path}/oneOf/{i}")
                                             for i, b in enumerate(kept)])
        if any(ra.refs(n) for n in nodes) and not self._exact:
            # a union of rules would let values matching two branches through: recompile them whole
            nodes, kept = self.exact(lambda: self._branches(branches, path))
        return self.one_of(nodes, path)

    def _branches(self, branches: list[Any], path: str) -> tuple[list[ra.Node], list[Any]]:
        """The satisfiable oneOf branches, compiled, and their schemas."""
        nodes, kept = [], []
        for i, branch in enumerate(branches):
            try:
                nodes.append(self.compile(branch, f"{path}/oneOf/{i}"))
                kept.append(branch)
            except Unsatisfiable:
                continue
        if not nodes:
            raise Unsatisfiable(f"no oneOf branch at {path} is satisfiable")
        return nodes, kept

    def _disjoint(self, nodes: list[ra.Node], branches: list[Any], path: str) -> bool:
        """Whether no value can match two branches: their first characters differ, or a required
        discriminator property's values do."""
        firsts = [_first_chars(n, self.rules, set(), self._pending_firsts) for n in nodes]

        def disjoint(i: int, j: int) -> bool:
            f, g = firsts[i], firsts[j]
            if f is not None and g is not None and not ra.intersect(f, g):
                return True
            return provably_disjoint(
                branches[i], branches[j], lambda ref: self.refs.resolve(ref, path)[1], KNOWN_FORMATS, _infer_type)

        return all(disjoint(i, j) for i in range(len(nodes)) for j in range(i + 1, len(nodes)))

    def one_of(self, nodes: list[ra.Node], path: str) -> ra.Node:
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

    def negated(self, s: dict, path: str) -> ra.Node:
        """`not` in its common forms: not a type, not some values, not some required properties."""
        rest = {k: v for k, v in s.items() if k != "not"}
        neg = s["not"]
        if neg is False:
            return self.compile(rest or True, path)
        if neg is True or not isinstance(neg, dict):
            raise Unsatisfiable(f"`not` at {path} excludes every value")
        n = normalize(neg, KNOWN_FORMATS)
        if set(n) == {"$ref"}:  # a named schema: its target's shape decides
            key, target = self.refs.resolve(n["$ref"], path)
            return self.negated({**rest, "not": target}, key)
        if not n:
            raise Unsatisfiable(f"`not` at {path} excludes every value")
        merged = _merged_all_of(n)
        if merged is not None:  # not: {allOf: [{required: [a]}, {required: [b]}]}, as one schema
            return self.negated({**rest, "not": merged}, path)
        keys = set(n)
        types = _as_types(rest.get("type", list(JSON_TYPES)))
        if keys == {"type"}:
            drop = _as_types(n["type"])
            if "number" in drop:
                drop.add("integer")
            if "integer" in drop and "number" in types and "number" not in drop:
                raise ValueError(f"json_schema not at {path}: `not: integer` beside number is not supported")
            left = [t for t in JSON_TYPES if t in types and t not in drop]
            if not left:
                raise Unsatisfiable(f"`not` at {path} excludes every type the schema allows")
            return self.compile({**rest, "type": left}, path)
        if keys <= {"enum", "const"}:
            values = [n["const"]] if "const" in n else []
            values += n.get("enum", [])
            return self.union([lambda t=t: self._without(rest, t, values, path) for t in types if t != "integer"
                               or "number" not in types], path)
        if "pattern" in keys and keys <= {"pattern", "type"} and _as_types(n.get("type", "string")) == {"string"}:
            makers = [lambda: self._string_not_matching(rest, n["pattern"], path)] if "string" in types else []
            others = [t for t in types if t != "string"]
            if "type" in n and others:  # a `not` that names its type lets the other types through
                makers.append(lambda: self.compile({**rest, "type": others}, path))
            return self.union(makers, path)
        if keys <= {"required", "properties", "type"} and _as_types(n.get("type", "object")) == {"object"}:
            branches = [{**rest, "type": [t for t in types if t != "object"]}] if "type" in n else []
            obj = conjoin_sub(rest, {"type": "object"})
            branches += [conjoin_sub(obj, {"properties": {r: False}}) for r in n.get("required", [])]
            branches += [conjoin_sub(obj, {"required": [p], "properties": {p: {"not": sub}}})
                         for p, sub in n.get("properties", {}).items()]
            return self.union([lambda b=b: self.compile(b, path) for b in branches if b.get("type", True) != []],
                              path)
        raise ValueError(f"json_schema not at {path}: only `not` with a type, enum/const, or required/properties "
                         f"is supported, got keywords {sorted(keys)}")

    def _string_not_matching(self, rest: dict, pattern: Any, path: str) -> ra.Node:
        """The schema's strings that no match of `pattern` occurs in. Written with raw characters only,
        as a pattern reads them (an escaped spelling of a matching string must not slip through)."""
        node = self.exact(lambda: self.compile({**rest, "type": "string"}, path))
        if ra.refs(node):
            raise ValueError(f"json_schema not at {path}: excluding a pattern from a recursive schema is not supported")
        raw = compiled_or_nothing(intersection([node, quoted(ra.repeat(ra.Chars(STRING_CHARS), 0, None))]))
        out = compiled_or_nothing(difference(raw, quoted(pattern_body(pattern, path))))
        if out == ra.NOTHING:
            raise Unsatisfiable(f"`not` at {path} excludes every string")
        return out

    def _without(self, rest: dict, t: str, values: list, path: str) -> ra.Node:
        node = self.exact(lambda: self.compile({**rest, "type": t}, path))
        drop = [quoted(spellings(v)) for v in values if t == "string" and isinstance(v, str)]
        drop += [ra.literal(const_text(v)) for v in values if t in ("boolean", "null") and _json_type(v) == t]
        numbers = [v for v in values if _json_type(v) in ("integer", "number")]
        if t == "integer":
            drop += [ra.literal(str(int(v))) for v in numbers if v == int(v)]
        elif t == "number" and numbers:
            raise ValueError(f"json_schema not at {path}: excluding numbers from a `number` is not supported")
        if t in ("object", "array") and any(_json_type(v) == t for v in values):
            raise ValueError(f"json_schema not at {path}: excluding {t} values is not supported")
        if not drop:
            return node
        if ra.refs(node):
            raise ValueError(f"json_schema not at {path}: excluding values from a recursive schema is not supported")
        out = compiled_or_nothing(difference(node, ra.alt(*drop)))
        if out == ra.NOTHING:
            raise Unsatisfiable(f"`not` at {path} excludes every {t}")
        return out

    def enum(self, s: dict, path: str) -> ra.Node:
        values = [s["const"]] if "const" in s else None
        if "enum" in s:
            if not isinstance(s["enum"], list) or not s["enum"]:
                raise ValueError(f"json_schema enum at {path} must be a non-empty list")
            values = s["enum"] if values is None else [v for v in values if v in s["enum"]]
        rest = {k: v for k, v in s.items() if k not in ("enum", "const")}
        if "type" in rest:
            allowed = _as_types(rest.pop("type"))
            values = [v for v in values if _json_type(v) in allowed
                      or (_json_type(v) == "integer" and "number" in allowed)]
        if not values:
            raise Unsatisfiable(f"no enum/const value at {path} satisfies the schema's other keywords")
        node = ra.alt(*(ra.literal(const_text(v)) for v in values))
        if not rest:
            return node
        other = self.exact(lambda: self.compile(rest, path))
        if ra.refs(other):
            raise ValueError(f"json_schema at {path}: enum/const together with keywords {sorted(rest)} "
                             "on a recursive value is not supported")
        out = compiled_or_nothing(intersection([node, other]))
        if out == ra.NOTHING:
            raise Unsatisfiable(f"no enum/const value at {path} satisfies the schema's other keywords")
        return out

    def any_value(self) -> ra.Node:
        if ANY_VALUE not in self.rules:
            self.rules[ANY_VALUE] = ra.NOTHING  # placeholder while the rule refers to itself
            value = ra.Ref(ANY_VALUE)
            pair = ra.seq(string_node(), self.punct(":"), value)
            comma = self.separator(True)
            self.rules[ANY_VALUE] = ra.alt(
                self.bracketed("{", ra.optional(ra.seq(pair, ra.repeat(ra.seq(comma, pair), 0, None))), "}"),
                self.bracketed("[", ra.optional(ra.seq(value, ra.repeat(ra.seq(comma, value), 0, None))), "]"),
                string_node(), number_node(None, None), ra.literal("true"), ra.literal("false"), ra.literal("null"),
            )
        return ra.Ref(ANY_VALUE)

    # ---- containers ---------------------------------------------------------------------------
    def object(self, s: dict, path: str) -> ra.Node:
        return object_node(self, s, path)

    def array(self, s: dict, path: str) -> ra.Node:
        lo, hi = _count(s, "minItems", 0, path), _count(s, "maxItems", None, path)
        if hi is not None and hi < lo:
            raise Unsatisfiable(f"maxItems {hi} is below minItems {lo} at {path}")
        if s.get("uniqueItems", False) and (hi is None or hi > 1) and \
                (_finite_values(s.get("items", True)) is not None or "uniqueItems" not in self.relaxed):
            return self.unique_array(s, lo, hi, path)
        prefix_schemas = s.get("prefixItems", [])
        if not isinstance(prefix_schemas, list):
            raise ValueError(f"json_schema prefixItems at {path} must be a list")
        prefix: list[ra.Node] = []
        for i, sub in enumerate(prefix_schemas):
            try:
                prefix.append(self.compile(sub, f"{path}/prefixItems/{i}"))
            except Unsatisfiable:
                break  # arrays end before an item that nothing satisfies
        items = s.get("items", s.get("unevaluatedItems", True))
        rest = None
        if items is not False and len(prefix) == len(prefix_schemas) and (hi is None or hi > len(prefix)):
            try:
                rest = self.compile(items, f"{path}/items")
            except Unsatisfiable:
                rest = None
        comma = self.separator(any(ra.refs(n) for n in prefix) or (rest is not None and bool(ra.refs(rest))))
        top = len(prefix) if hi is None else min(len(prefix), hi)
        options = [_joined(prefix[:n], comma) for n in range(lo, top + 1)]
        if rest is not None:
            more_lo, more_hi = max(lo - len(prefix), 1), None if hi is None else hi - len(prefix)
            if prefix:
                options.append(ra.seq(_joined(prefix, comma), ra.repeat(ra.seq(comma, rest), more_lo, more_hi)))
            else:
                options.append(ra.seq(rest, ra.repeat(ra.seq(comma, rest), more_lo - 1,
                                                      None if more_hi is None else more_hi - 1)))
        if not options:
            raise Unsatisfiable(f"no array length satisfies minItems/maxItems/prefixItems at {path}")
        return self.bracketed("[", ra.alt(*options), "]")

    def unique_array(self, s: dict, lo: int, hi: int | None, path: str) -> ra.Node:
        """uniqueItems over a finite set of item values (an enum, booleans): an automaton over the
        set of values used so far. Other item schemas cannot be enforced, and are refused."""
        values = _finite_values(s.get("items", True)) if not s.get("prefixItems") else None
        if values is None or len(values) > MAX_UNIQUE_VALUES:
            raise ValueError(f"json_schema keyword 'uniqueItems' at {path} is supported only for items with at "
                             f"most {MAX_UNIQUE_VALUES} possible values (an enum, const or boolean), or maxItems <= 1; "
                             "relax it explicitly (relaxed=['uniqueItems']) to generate without it")
        comma = self.separator(False)
        texts = list(dict.fromkeys(const_text(_canonical(v)) for v in values))
        edges = [(used, ra.seq(comma if used else ra.EMPTY, ra.literal(text)), used | 1 << i)
                 for used in range(1 << len(texts)) for i, text in enumerate(texts) if not used >> i & 1]
        finals = tuple(used for used in range(1 << len(texts))
                       if lo <= used.bit_count() and (hi is None or used.bit_count() <= hi))
        if not finals:
            raise Unsatisfiable(f"no array of distinct items at {path} has between minItems and maxItems items")
        body = ra.Graph(1 << len(texts), tuple(edges), finals)
        return self.bracketed("[", body, "]")

    # ---- scalars ------------------------------------------------------------------------------
    def string(self, s: dict, path: str) -> ra.Node:
        lo, hi = _count(s, "minLength", 0, path), _count(s, "maxLength", None, path)
        if hi is not None and hi < lo:
            raise Unsatisfiable(f"maxLength {hi} is below minLength {lo} at {path}")
        bodies = [FORMATS[s["format"]]] if "format" in s else []
        patterns = s.get("pattern", ())
        bodies += [pattern_body(p, path) for p in (patterns if isinstance(patterns, tuple) else (patterns,))]
        if not bodies:
            return self.long_string(lo, hi) if self.rule_size is not None and (hi or 0) > 2 * STRING_CHUNK \
                else string_node(lo, hi)
        node = constrained_string(bodies, lo, hi)
        if node == ra.NOTHING or node == quoted(ra.NOTHING):
            raise Unsatisfiable(f"no string at {path} satisfies its pattern, format and length together")
        return node

    def long_string(self, lo: int, hi: int) -> ra.Node:
        """A string of lo..hi characters, as chunks of exactly STRING_CHUNK characters then a last piece
        that closes the quote: one lexeme of thousands of counted characters would be a DFA too large
        to build. Longest-match lexing reads a chunk only where the string goes on past it."""
        self.rules.setdefault("string_chunk", string_body(STRING_CHUNK, STRING_CHUNK))
        tail: ra.Node = ra.NOTHING
        for j in reversed(range(hi // STRING_CHUNK + 1)):  # rule j: the rest after j chunks
            last_lo, last_hi = max(0, lo - j * STRING_CHUNK), min(STRING_CHUNK, hi - j * STRING_CHUNK)
            last = ra.seq(string_body(last_lo, last_hi), ra.literal('"')) if last_lo <= last_hi else ra.NOTHING
            more = ra.seq(ra.Ref("string_chunk"), tail) if tail != ra.NOTHING else ra.NOTHING
            name = f"string_{lo}_{hi}_{j}"
            self.rules[name] = ra.alt(last, more)
            tail = ra.Ref(name)
        return ra.seq(ra.literal('"'), tail)

    def number(self, t: str, s: dict, path: str) -> ra.Node:
        lo, hi = _bound(s, "minimum", "exclusiveMinimum", path), _bound(s, "maximum", "exclusiveMaximum", path)
        step = s.get("multipleOf")
        if step is not None and (not isinstance(step, int | float) or isinstance(step, bool) or step <= 0):
            raise ValueError(f"json_schema multipleOf at {path} must be a positive number, got {step!r}")
        if step is not None:
            return self._multiples(t, as_decimal(step), lo, hi, path)
        if t == "integer":
            return integer_node(*_int_bounds(lo, hi, path))
        node = number_node(lo, hi)
        if node == ra.NOTHING:
            raise Unsatisfiable(f"no number lies within the bounds at {path}")
        return node

    def _multiples(self, t: str, step: Decimal, lo, hi, path: str) -> ra.Node:
        """Integers that are multiples of `step`; for `number`, decimals with a step of 10^-d."""
        num, den = step.as_integer_ratio()
        if t == "number" and num == 1 and den > 1 and 10 ** (len(str(den)) - 1) == den:
            digits = len(str(den)) - 1
            fits = parse_regex(rf"-?[0-9]+(?:\.[0-9]{{1,{digits}}})?")
            out = compiled_or_nothing(intersection([number_node(lo, hi), fits]))
        else:
            # an integer n is a multiple of num/den iff n is a multiple of num / gcd(num, den)
            if t == "number" and den != 1:
                raise ValueError(f"json_schema multipleOf {step} at {path} on a number is not supported "
                                 "(integers, or steps like 0.01, are)")
            k = num // math.gcd(num, den)
            a, b = _int_bounds(lo, hi, path)
            out = integer_node(a, b) if k == 1 else compiled_or_nothing(intersection([integer_node(a, b), multiples_of(k)]))
        if out == ra.NOTHING:
            raise Unsatisfiable(f"no multiple of {step} lies within the bounds at {path}")
        return out


# ---- helpers ----------------------------------------------------------------------------------
def _joined(items: list[ra.Node], comma: ra.Node) -> ra.Node:
    return ra.seq(*(ra.seq(comma, x) if i else x for i, x in enumerate(items)))


_TYPE_HINTS = (
    ("object", {"properties", "required", "additionalProperties", "patternProperties", "propertyNames",
                "minProperties", "maxProperties", "unevaluatedProperties"}),
    ("array", {"items", "prefixItems", "minItems", "maxItems", "uniqueItems", "unevaluatedItems"}),
    ("string", {"pattern", "format", "minLength", "maxLength"}),
    ("number", {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf"}),
)


def _infer_type(schema: dict) -> str | None:
    """The type a schema's keywords imply, when it names none (a strict choice: other types would
    be unconstrained by those keywords)."""
    keys = set(schema)
    return next((t for t, hints in _TYPE_HINTS if keys & hints), None)


def _as_types(value: Any) -> set[str]:
    return {value} if isinstance(value, str) else set(value)


def _json_type(value: Any) -> str:
    if isinstance(value, bool):
        return "boolean"
    if value is None:
        return "null"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "integer" if value == int(value) else "number"
    return {str: "string", list: "array", dict: "object"}[type(value)]


_TYPE_FIRSTS = {"object": "{", "array": "[", "string": '"', "integer": "-0-9", "number": "-0-9", "boolean": "tf",
                "null": "n"}


def _type_first_chars(schema: Any) -> ra.Ranges | None:
    """The first characters of a schema's values, from its `type` alone (None when it has no type)."""
    if not isinstance(schema, dict):
        return None
    s = normalize(schema, KNOWN_FORMATS)
    types = s.get("type") if not set(s) & {"$ref", "allOf", "anyOf", "oneOf"} else None
    if types is None or "enum" in s or "const" in s:
        return None
    node = ra.alt(*(ra.char_class(_TYPE_FIRSTS[t]) for t in _as_types(types) if t in _TYPE_FIRSTS))
    return node.ranges if isinstance(node, ra.Chars) else None


def _first_chars(node: ra.Node, rules: dict[str, ra.Node], seen: set[str],
                 pending: dict[str, ra.Ranges | None]) -> ra.Ranges | None:
    """The characters a match of `node` can start with; None when unknown or it may match nothing."""
    if isinstance(node, ra.Chars):
        return node.ranges
    if isinstance(node, ra.Ref):
        if node.name in seen:
            return ()  # a rule at its own start adds no first character
        if node.name not in rules:
            return pending.get(node.name)  # a rule still being compiled: known by its type, if any
        return _first_chars(rules[node.name], rules, seen | {node.name}, pending)
    if isinstance(node, ra.Alt):
        parts = [_first_chars(x, rules, seen, pending) for x in node.items]
        return None if any(p is None for p in parts) else ra.normalize(r for p in parts for r in p)
    if isinstance(node, ra.Seq):
        out: list = []
        for item in node.items:
            first = _first_chars(item, rules, seen, pending)
            if first is not None and not ra.nullable(item):
                return ra.normalize([*out, *first])
            if first is None:  # nullable with unknown start: be conservative
                return None
            out += first
        return None
    if isinstance(node, ra.Repeat | ra.Bounded):
        first = _first_chars(node.item, rules, seen, pending)
        return None if isinstance(node, ra.Repeat) and node.min == 0 else first
    if isinstance(node, ra.Compiled):
        if node.dfa.accept[node.dfa.start] >= 0:
            return None
        row = node.dfa.trans[node.dfa.start]
        return ra.normalize(r for c, ranges in enumerate(node.dfa.alphabet.classes) if row[c] >= 0 for r in ranges)
    return None


def _merged_all_of(schema: dict) -> dict | None:
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


def _lexes_alone(node: ra.Node) -> bool:
    """Whether every match starts with '{', '[' or '"' (an object, array or string: each ends where
    its bracket or quote closes, so a rule of its own lexes well, as a number would not)."""
    first = node
    while isinstance(first, ra.Seq) and first.items:
        first = first.items[0]
    return isinstance(first, ra.Chars) and first.ranges in (((0x7B, 0x7B),), ((0x5B, 0x5B),), ((0x22, 0x22),))


def _finite_values(items: Any) -> list | None:
    """The values an items schema allows when it is a plain enum, const or boolean, else None."""
    if not isinstance(items, dict):
        return None
    s = normalize(items, KNOWN_FORMATS)
    types = _as_types(s.pop("type", list(JSON_TYPES)))
    if not s and types == {"boolean"}:
        return [True, False]
    if set(s) - {"enum", "const"}:
        return None
    if not s:
        return None
    values = [s["const"]] if "const" in s else s["enum"]
    if "const" in s and "enum" in s:
        values = [v for v in values if v in s["enum"]]
    return [v for v in values if _json_type(v) in types or (_json_type(v) == "integer" and "number" in types)]


def _canonical(value: Any) -> Any:
    """One spelling per JSON value (1.0 and 1 are equal, so they must not both appear as unique items)."""
    return int(value) if isinstance(value, float) and value == int(value) else value


def _dependencies_as_all_of(s: dict, path: str) -> dict:
    """Each dependency as a choice: the trigger property absent, or present with what it needs."""
    rest = {k: v for k, v in s.items() if k not in ("dependentRequired", "dependentSchemas")}
    choices = []
    for name, needs in s.get("dependentRequired", {}).items():
        choices.append({"anyOf": [{"properties": {name: False}}, {"required": [name, *needs]}]})
    for name, sub in s.get("dependentSchemas", {}).items():
        choices.append({"anyOf": [{"properties": {name: False}}, {"allOf": [{"required": [name]}, sub]}]})
    if 2 ** len(choices) > MAX_BRANCHES:
        raise ValueError(f"json_schema at {path}: more than {MAX_BRANCHES.bit_length() - 1} dependencies "
                         "on one object are not supported")
    return {**rest, "allOf": [*rest.get("allOf", []), *choices]}


def _count(schema: dict, key: str, default: int | None, path: str) -> int | None:
    value = schema.get(key, default)
    if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
        raise ValueError(f"json_schema {key} at {path} must be a non-negative integer, got {value!r}")
    return value


def _bound(schema: dict, key: str, exclusive_key: str, path: str) -> tuple[Decimal, bool] | None:
    """(bound, exclusive): the tighter of the inclusive and exclusive keywords, as exact decimals."""
    value, excl = schema.get(key), schema.get(exclusive_key)
    for k, v in ((key, value), (exclusive_key, excl)):
        if v is not None and (not isinstance(v, int | float) or isinstance(v, bool) or not math.isfinite(v)):
            raise ValueError(f"json_schema {k} at {path} must be a finite number, got {v!r}")
    inclusive = None if value is None else (as_decimal(value), False)
    exclusive = None if excl is None else (as_decimal(excl), True)
    if inclusive is None or exclusive is None:
        return inclusive or exclusive
    tighter = exclusive[0] >= inclusive[0] if key == "minimum" else exclusive[0] <= inclusive[0]
    return exclusive if tighter else inclusive


def _int_bounds(lo, hi, path: str) -> tuple[int | None, int | None]:
    low = None if lo is None else (math.floor(lo[0]) + 1 if lo[1] else math.ceil(lo[0]))
    high = None if hi is None else (math.ceil(hi[0]) - 1 if hi[1] else math.floor(hi[0]))
    if low is not None and high is not None and low > high:
        raise Unsatisfiable(f"no integer lies in [{low}, {high}] at {path}")
    return low, high
