"""JSON Schema -> a grammar: a regex tree per rule, with `Ref`s where schemas recurse.

The schema's own semantics by default: objects write their properties in any order, and undeclared
ones wherever `additionalProperties` allows them (absent: allowed). `strict` (OpenAI's structured
outputs, xgrammar's strict mode) writes declared properties in schema order (required ones always,
optional ones maybe) and undeclared ones only where `patternProperties` or an explicit
`additionalProperties` allows them (or the object declares nothing at all); see json_objects. Numbers and
strings get exact regexes for their bounds, lengths, patterns and formats. Keywords that only annotate
are ignored, as the specification says; a constraint that cannot be enforced is refused, never dropped.
A schema without recursion comes out as one regular expression (the fast DFA path); a recursive one
(a `$ref` cycle, or an unconstrained value, which is any JSON) comes out as rules for the LALR engine.
Whitespace between tokens follows one finite pattern; compact (none) by default.
"""
from __future__ import annotations

import contextlib
import functools
import itertools
import json
from dataclasses import dataclass, field
from typing import Callable, Iterable, Iterator, cast

from .. import deadline
from ..grammar.member_check import MemberCheck
from ..regex import regex_ast as ra
from ..regex.automaton import char_sets, compile_dfa, own_chars
from ..regex.regex_parser import parse_regex
from .contract import KeepsOrder
from .json_arrays import array_node
from .json_checked import checked_object
from .json_combinators import all_of, combinator, dependencies_as_all_of, enum
from .json_not import negated
from .json_objects import ANY_MARKER, ANY_MARKER_PATH, LAZY_MARKERS, LazyObject, object_node
from .json_refs import RefResolver, ref_siblings_dropped
from .json_scalar_schemas import number_schema, string_schema
from .json_scalars import number_node, string_node
from .json_types import KNOWN_FORMATS, first_chars, infer_type, lexes_alone, type_first_chars, unchecked_format
from .json_unions import Container, LinkedBody, merged_body
from .schema_merge import JSON_TYPES, Unsatisfiable, normalize

ANY_VALUE = "json_value"  # the rule for an unconstrained JSON value
LEXEME_BOUNDARY = "lexeme_boundary"
PIECE = "piece_"  # the names of rules made only for size (`piece`): their bodies may be one lexeme
JSON_REGEX_MAX_SIZE = 20_000  # a schema whose regex is larger (in NFA states) compiles as a grammar
JSON_RULE_SIZE = 2_000  # ... where every object, array or string larger than this is a rule of its own
# in a schema that is otherwise regular, an undeclared property's value (the default `additionalProperties`)
# nests at most this deep (two: an object of arrays, as most values are), so the schema stays one DFA; where the
# schema has lazily built objects anyway, deeper containers are a marker (json_objects.ANY_MARKER) that
# object_dispatch lays a level at a time as a decode reaches it, so the value nests any depth (not inside oneOf /
# not, whose languages are intersected and subtracted); in a schema that is a grammar, any value
UNDECLARED_VALUE_DEPTH = 2
RELAXABLE = frozenset({"uniqueItems", "oneOf"})  # keywords a caller may leave unenforced where they cannot be enforced
_UNSUPPORTED = ("contains", "$dynamicRef", "$recursiveRef")
JSON_WHITESPACE = frozenset(b" \t\n\r")
Relaxed = str | Iterable[str] | None  # keywords left unenforced: names, or one comma-separated string


@dataclass(slots=True)
class JsonGrammar:
    root: ra.Node
    rules: dict[str, ra.Node] = field(default_factory=dict)  # empty: `root` is a plain regex
    unenforced: tuple[str, ...] = ()  # relaxed keywords the schema holds: "<keyword> at <path>"
    lazy: tuple[LazyObject, ...] = ()  # objects `root` holds as markers, built lazily (object_dispatch)
    checks: tuple[MemberCheck, ...] = ()  # objects `rules` reads in any order, checked (grammar/member_check)
    any_level: ra.Node | None = None  # where `root` reads json_objects.ANY_MARKER: the level of containers it reads


def schema_to_dict(schema: object, field: str = "json_schema") -> dict | bool:
    """A schema given as a dict, a JSON string, or a pydantic model class, as a plain dict, read as its draft
    reads it (json_refs.ref_siblings_dropped); errors name `field`."""
    if isinstance(schema, type) and hasattr(schema, "model_json_schema"):
        return schema.model_json_schema()
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except json.JSONDecodeError as e:
            raise ValueError(f"{field} is not valid JSON: {e}") from None
    if not isinstance(schema, dict | bool):
        raise ValueError(f"{field} must be a dict, a JSON string, or a pydantic model class, "
                         f"got {type(schema).__name__}")
    return ref_siblings_dropped(schema)


def whitespace_node(pattern: str | None) -> ra.Node:
    """The whitespace allowed between JSON tokens: none (compact) or a finite pattern of JSON blanks."""
    if pattern is None:
        return ra.EMPTY
    node = parse_regex(pattern)
    dfa = compile_dfa([node])
    if not dfa.is_finite():
        raise ValueError(f"JSON whitespace pattern {pattern!r} must match a bounded length (e.g. '[ ]?')")
    read = (dfa.trans >= 0).any(axis=0)
    used = {b for b in range(256) if read[dfa.byte_class[b]]}  # type: ignore[index]  # stubs: any(axis=0) may be bool
    if not used <= JSON_WHITESPACE:
        raise ValueError(f"JSON whitespace pattern {pattern!r} may only match spaces, tabs and newlines")
    return node


def relaxed_keywords(relaxed: Relaxed) -> frozenset[str]:
    """The keywords a caller lets go unenforced where they cannot be enforced (`uniqueItems`, `oneOf`),
    as names or one comma-separated string."""
    if isinstance(relaxed, str):
        relaxed = [k.strip() for k in relaxed.split(",") if k.strip()]
    out = frozenset(relaxed or ())
    if not out <= RELAXABLE:
        raise ValueError(f"json_schema relaxed keywords must be among {sorted(RELAXABLE)}, got {sorted(out)}")
    return out


def compile_json_schema(schema: object, whitespace: str | None = None, relaxed: Relaxed = (),
                        strict: bool = False, lazy_objects: bool = False,
                        not_lazy: frozenset[str] = frozenset(), checked_objects: bool = True,
                        rules_form: bool = False, any_order: bool = False) -> JsonGrammar:
    """One regex when the schema is small and regular; else a grammar whose large objects and arrays
    are rules of their own, so that each lexer DFA stays the size of one such piece. `relaxed` names
    keywords to leave unenforced where they cannot be enforced (opt-in; by default they are refused).
    `strict`: objects in declared order, closed unless the schema opens them (module docstring).
    `lazy_objects`: in one regex, an object too large for its members to take any order eagerly is a
    marker (JsonGrammar.lazy) for object_dispatch to build lazily, not kept in declared order (except
    those at the paths `not_lazy`). `checked_objects`: in a grammar, such objects (and unions of objects) read
    their members in any order, checked by the parser (json_checked), not in declared order. `rules_form`: a
    grammar whose large objects, arrays and strings are rules of their own even where the schema is small and
    regular (so that its large objects are checked rather than lazy: the caller's way out where lazy objects
    cannot be, a union of them). `any_order`: raise KeepsOrder at the first object the schema would keep in declared
    order (the caller's way out then is another, and the rest of this compile would be wasted)."""
    root = schema_to_dict(schema)
    ws = whitespace_node(whitespace)
    relax = relaxed_keywords(relaxed)
    try:
        with _compile_errors():
            compiler = _SchemaCompiler(root, ws, relax, strict=strict, lazy=lazy_objects and not strict)
            compiler.not_lazy = not_lazy
            # this pass decides whether the schema is one regex and, if not, how the grammar below is built: it
            # stops once its rules decide that (a recursive rule larger than one regex may be, or any rule in the
            # rules form; JSONSchemaBench's two slowest grammars spent 0.3 and 0.8 s of this pass past that point)
            compiler.stop_when_grammar = JSON_REGEX_MAX_SIZE if not rules_form else 0
            try:
                node = compiler.compile(root, "#")
                small = not rules_form and all(ra.size(r) <= JSON_REGEX_MAX_SIZE for r in (
                    node, *compiler.rules.values(), *(v for o in compiler.lazy or [] for v in (*o.values, *o.extra_values))))
            except _GrammarDecided:
                small = False
            lazy = compiler.lazy or []
            if small and not compiler.rules:
                if compiler.lazy_any and not lazy:  # no lazy object: one plain DFA builds and walks faster than a
                    # growing table (a fifth off compile p50 on JSONSchemaBench), so its undeclared values are bounded
                    return compile_json_schema(schema, whitespace, relaxed, strict, lazy_objects,
                                               not_lazy | {ANY_MARKER_PATH}, checked_objects, rules_form, any_order)
                kept = next((r for r in compiler.unenforced if r.startswith("property order")), None)
                if any_order and kept is not None:
                    raise KeepsOrder(kept)
                return JsonGrammar(node, {}, _summary(compiler.unenforced), tuple(lazy),
                                   any_level=_any_level(ws) if compiler.lazy_any else None)
            if lazy or compiler.lazy_any:  # a grammar, whose objects are never lazy: sized as they would be without
                raise _LazyInExact()
    except _LazyInExact:  # or its intersection or difference would not see the lazy object's members
        return compile_json_schema(schema, whitespace, relaxed, strict, rules_form=rules_form, any_order=any_order)
    with _compile_errors():
        compiler = _SchemaCompiler(root, ws, relax, rule_size=None if small else JSON_RULE_SIZE, strict=strict,
                                   any_undeclared=bool(compiler.rules))
        compiler.checked = checked_objects and not strict
        compiler.any_order_only = any_order
        node = compiler.compile(root, "#")
    return JsonGrammar(node, compiler.rules, _summary(compiler.unenforced), checks=tuple(compiler.member_checks))


@contextlib.contextmanager
def _compile_errors() -> Iterator[None]:
    """A schema's errors as ValueErrors that say what is wrong with it."""
    try:
        yield
    except Unsatisfiable as e:
        raise ValueError(f"json_schema: no value can satisfy it ({e})") from None
    except RecursionError:
        raise ValueError("json_schema nests too deeply to compile") from None
    except (TypeError, AttributeError) as e:  # a keyword whose value has the wrong JSON type
        raise ValueError(f"json_schema is malformed: {e}") from None


class _GrammarDecided(Exception):
    """The first pass met a rule that makes the schema a grammar, and fixes how it is built (see compile_json_schema):
    the rest of that pass would change neither."""


class _LazyInExact(Exception):
    """A lazy object's marker met an intersection or difference, or the schema is a grammar: it compiles
    without lazy objects."""


def _holds_marker(out: object) -> bool:
    """Whether a node (or nodes, nested in lists and tuples) reads a lazy object's marker character."""
    if isinstance(out, list | tuple):
        return any(_holds_marker(x) for x in out)
    if not isinstance(out, ra.Node):  # type: ignore[arg-type]  # Node is a union of node classes
        return False
    lo, hi = min(LAZY_MARKERS), max(*LAZY_MARKERS, ord(ANY_MARKER))
    return any(a <= hi and b >= lo for ranges in char_sets([cast(ra.Node, out)]) for a, b in ranges)


def _scalar() -> ra.Node:
    """Any JSON string, number, `true`, `false` or `null`."""
    return ra.alt(string_node(), number_node(None, None), ra.literal("true"), ra.literal("false"), ra.literal("null"))


def _containers(ws: ra.Node, value: ra.Node) -> ra.Node:
    """A JSON object or array whose members' and items' values are `value`."""
    comma, colon = ra.seq(ws, ra.literal(","), ws), ra.seq(ws, ra.literal(":"), ws)
    pair = ra.seq(string_node(), colon, value)
    return ra.alt(
        ra.seq(ra.literal("{"), ws, ra.optional(ra.seq(pair, ra.repeat(ra.seq(comma, pair), 0, None))), ws,
               ra.literal("}")),
        ra.seq(ra.literal("["), ws, ra.optional(ra.seq(value, ra.repeat(ra.seq(comma, value), 0, None))), ws,
               ra.literal("]")))


@functools.lru_cache(maxsize=16)
def _any_value(ws: ra.Node, lazy: bool) -> ra.Node:
    """Any JSON value, its containers inline UNDECLARED_VALUE_DEPTH levels deep, as one minimal DFA (built once);
    past those, with `lazy`, the containers' marker (`_any_level`'s), else none."""
    scalar = _scalar()
    # a value reads a container inline or (at the last level) the marker, never both: object_dispatch lays the
    # marker's level beside the state's own moves, which must read apart
    value = ra.alt(scalar, ra.literal(ANY_MARKER)) if lazy else scalar
    for _ in range(UNDECLARED_VALUE_DEPTH):
        value = ra.alt(scalar, _containers(ws, value))
    return ra.Compiled(own_chars([value], False))


@functools.lru_cache(maxsize=8)
def _any_level(ws: ra.Node) -> ra.Node:
    """What ANY_MARKER reads: one level of containers, whose values are scalars or the marker again."""
    return ra.Compiled(own_chars([_containers(ws, ra.alt(_scalar(), ra.literal(ANY_MARKER)))], False))


def _summary(reports: list[str], shown: int = 3) -> tuple[str, ...]:
    """The reports once each; objects that keep their declared order, the first `shown` by place and
    the rest counted (a large schema has dozens)."""
    unique = list(dict.fromkeys(reports))
    order = [r for r in unique if r.startswith("property order at ")]
    if len(order) <= shown:
        return tuple(unique)
    rest = [r for r in unique if r not in order]
    return (*order[:shown], f"property order at {len(order) - shown} more objects", *rest)


class _SchemaCompiler:
    def __init__(self, root: dict | bool, ws: ra.Node, relaxed: frozenset[str] = frozenset(),
                 rule_size: int | None = None, strict: bool = False, any_undeclared: bool = False,
                 lazy: bool = False):
        self.relaxed = relaxed
        self.strict = strict
        self.strict_root = strict  # the whole schema is strict (else only oneOf branches that overlap are)
        self.any_undeclared = any_undeclared  # undeclared properties' values: any JSON (a rule), else bounded
        self.unenforced: list[str] = []
        self.lazy: list[LazyObject] | None = [] if lazy else None  # objects left as markers (json_objects)
        self.not_lazy: frozenset[str] = frozenset()  # ... but not these (paths)
        self._split_all = 0  # >0: every bracket and member is a lexeme of its own (see split_alike)
        self.rule_size = rule_size  # objects, arrays and strings larger than this become rules (None: never)
        self._pieces: dict[str, ra.Node] = {}  # compiled subschemas (rules among them), by schema text
        self._piece_count = 0
        self.exact_depth = 0  # >0 inside oneOf / not / enum, where sub-languages must stay regular
        self.bounded_any = 0  # >0: any value nests at most UNDECLARED_VALUE_DEPTH deep (one regex, fewer values)
        self.lazy_any = False  # an undeclared value holds ANY_MARKER (lazy mode, outside exact languages)
        self.pending_firsts: dict[str, ra.Ranges | None] = {}  # rules being compiled: first characters by type
        self.refs = RefResolver(root)
        self.ws = ws
        self.rules: dict[str, ra.Node] = {}
        # a rule larger than this (None: never) raises _GrammarDecided at the next schema compiled (0: any rule)
        self.stop_when_grammar: int | None = None
        self._rules_sized = 0  # rules already checked against it, in the order they were added
        self.any_order_only = False  # an object kept in declared order raises KeepsOrder (compile_json_schema)
        self._inline: dict[str, ra.Node] = {}
        self.open_refs: set[str] = set()
        self._recursive: set[str] = set()
        self.merged_names: dict[str, str] = {}  # rules for merged allOfs that recurse, by content
        self._containers: dict[ra.Node, Container] = {}  # each bracketed node, by itself: unions merge them
        self._linked: dict[ra.Node, LinkedBody] = {}  # container bodies' NFAs, kept across merged_body's tries
        self.checked = False  # objects past the eager any-order automaton checked by the grammar (json_checked)
        self.member_checks: list[MemberCheck] = []
        self.checked_objects: dict[tuple, tuple[ra.Node, MemberCheck]] = {}  # by members and required keys
        self.shapes: dict[ra.Node, tuple] = {}  # objects' (and checked unions') json_checked.ObjectShapes, by node
        self.fallbacks: dict[ra.Node, Callable[[], ra.Node]] = {}  # checked objects' declared-order form

    # ---- tokens -------------------------------------------------------------------------------
    def punct(self, c: str) -> ra.Node:
        return ra.seq(self.ws, ra.literal(c), self.ws)

    def exact(self, make):
        """`make()` with no subschema turned into a rule (its language is intersected or subtracted)."""
        self.exact_depth += 1
        try:
            out = make()
        finally:
            self.exact_depth -= 1
        if self.lazy and _holds_marker(out):  # a $ref compiled before, holding a lazy object
            raise _LazyInExact()
        return out

    def boundary(self) -> ra.Node:
        """An empty rule: a place where the grammar's lexer must end one lexeme and start the next."""
        self.rules.setdefault(LEXEME_BOUNDARY, ra.EMPTY)
        return ra.Ref(LEXEME_BOUNDARY)

    def bracketed(self, opening: str, body: ra.Node, closing: str) -> ra.Node:
        """`body` in brackets; around a rule (or where asked), the brackets are lexemes of their own."""
        split = self._split_all or bool(ra.refs(body) - {LEXEME_BOUNDARY})
        cut = self.boundary() if split and not self.exact_depth else ra.EMPTY
        node = ra.seq(ra.literal(opening), self.ws, cut, body, cut, self.ws, ra.literal(closing))
        self._containers[node] = Container(opening, body, closing)
        return node

    def merge_containers(self, nodes: list[ra.Node]) -> list[ra.Node]:
        """Alternatives that are objects (or arrays) holding rules, as one object (or array) whose body
        reads the union of theirs (json_unions): an LALR parser cannot carry two readings of one text."""
        if self.exact_depth:
            return nodes
        nodes = self._checked_union(nodes)
        opened = [self._containers.get(self.rules.get(n.name, n) if isinstance(n, ra.Ref) else n) for n in nodes]
        out, merged = [], set()
        for i, node in enumerate(nodes):
            if i in merged:
                continue
            box = opened[i]
            group = [j for j, other in enumerate(opened) if j >= i and box and other and other.opening == box.opening]
            body = None
            bodies = [member.body for j in group if (member := opened[j]) is not None]  # all are containers
            if len(group) > 1 and any(ra.refs(b) for b in bodies):
                body = merged_body(bodies, self._linked)
            if body is None:
                out.append(node)
                continue
            merged.update(group)
            assert box is not None, "a merged body comes from a group of containers like this one"
            out.append(self.bracketed(box.opening, body, box.closing))
        return out

    def _checked_union(self, nodes: list[ra.Node]) -> list[ra.Node]:
        """Alternatives among which an object is checked (json_checked): the objects as one checked object
        where their shapes allow, else each checked one in declared order (its fallback)."""
        boxes = [self.rules.get(n.name, n) if isinstance(n, ra.Ref) else n for n in nodes]
        objects = [i for i, box in enumerate(boxes) if (c := self._containers.get(box)) and c.opening == "{"]
        if len(objects) < 2 or not any(boxes[i] in self.fallbacks or ra.refs(self._containers[boxes[i]].body)
                                       for i in objects):  # objects of one regex: the lexer's DFA reads their union
            return nodes
        shapes = [self.shapes.get(boxes[i]) for i in objects]  # a checked union's: its branches'
        united = checked_object(self, [s for group in shapes for s in group]) if all(shapes) else None  # type: ignore[union-attr]
        if united is not None:
            return [united, *(n for i, n in enumerate(nodes) if i not in objects)]
        return [self.fallbacks[boxes[i]]() if i in objects and boxes[i] in self.fallbacks else n
                for i, n in enumerate(nodes)]

    def separator(self, members_apart: bool) -> ra.Node:
        """The comma between members or items; where they hold rules (or where asked), it is a lexeme of its
        own. A lexeme spanning an optional member would read on greedily into the next member's key and fail
        where that member is absent; and a comma that starts one member's lexeme (`,"a":"..."`, rule-free) where
        another member's comma stands alone (its value holds a rule) made the lexer read `,"` into the first and
        refuse the second's key (JSONSchemaBench's strmprivacy DataConnector: a false reject)."""
        comma = self.punct(",")
        apart = (members_apart or self._split_all) and not self.exact_depth
        return ra.seq(self.boundary(), comma, self.boundary()) if apart else comma

    def _one_lexeme(self, node: ra.Node) -> bool:
        """Whether `node` lexes as one lexeme: no rule in it, a large piece's (a rule of one lexeme: `piece`)
        body read through. A union of large objects is a union of such pieces: taken for rules, the ones of
        one lexeme were not split like those holding rules, and after `{` the lexer read on into them only
        (JSONSchemaStore's monika-config-schema: 21 of its 22 notification kinds refused)."""
        if isinstance(node, ra.Ref) and node.name.startswith(PIECE):  # a piece's body is never a bare rule name
            node = self.rules.get(node.name, node)
        return not ra.refs(node)

    def split_alike(self, nodes: list[ra.Node], remake) -> list[ra.Node]:
        """Alternatives that start alike where one holds a rule: the lexer reads the longest match and never
        backs up, so where one alternative's first lexeme ends (at a rule) and another's reads on, only the
        longer is followed. Each alternative of one lexeme that starts alike with one holding a rule is remade
        with every bracket and member a lexeme of its own, and so is each alternative holding a rule that
        starts alike with a remade one: its first lexeme may run on past its brace too (an object kept in
        declared order lexes its members up to its first rule with the brace)."""
        if self.exact_depth:
            return nodes
        whole = [self._one_lexeme(n) for n in nodes]
        if all(whole):
            return nodes
        firsts = [first_chars(n, self.rules, set(), self.pending_firsts) for n in nodes]

        def alike(i: int, j: int) -> bool:
            a, b = firsts[i], firsts[j]
            return a is None or b is None or bool(ra.intersect(a, b))

        ruled = [j for j, w in enumerate(whole) if not w]
        remade = {i for i, w in enumerate(whole) if w and any(alike(i, j) for j in ruled)}
        remade |= {j for j in ruled if any(alike(i, j) for i in remade)}
        out = []
        for i, node in enumerate(nodes):
            if i in remade:
                self._split_all += 1
                try:
                    node = remake(i)
                finally:
                    self._split_all -= 1
            out.append(node)
        return out

    # ---- dispatch -----------------------------------------------------------------------------
    def compile(self, schema: object, path: str) -> ra.Node:
        deadline.check()
        if (self.lazy or self.lazy_any) and self.rules:  # markers in a grammar: it compiles again without, so stop now
            raise _LazyInExact()
        if self.stop_when_grammar is not None and len(self.rules) > self._rules_sized:
            self._stop_if_grammar()
        if schema is True:
            return self.any_value()
        if schema is False:
            raise Unsatisfiable(f"the schema at {path} is `false`")
        if not isinstance(schema, dict):
            raise ValueError(f"json_schema at {path} must be an object or a boolean, got {schema!r}")
        if self.exact_depth:
            return self._compile(schema, path)
        key = ("split:" if self._split_all else "") + ("strict:" if self.strict else "") + json.dumps(schema, default=repr)
        hit = self._pieces.get(key)
        if hit is not None:
            return hit
        # a container around a rule is a rule too, one per schema: two alternatives that share it
        # (anyOf branches alike up to a late member) then parse it as one, where two copies of its
        # rules would be an LALR conflict
        node = self.piece(self._compile(schema, path), ruled=True)
        self._pieces[key] = node
        return node

    def keeps_order(self, report: str) -> None:
        if self.any_order_only:
            raise KeepsOrder(report)
        self.unenforced.append(report)

    def _stop_if_grammar(self) -> None:
        """Raises _GrammarDecided where a rule added since the last call is larger than `stop_when_grammar` (a rule's
        body only grows once written: placeholders are empty)."""
        added = itertools.islice(reversed(self.rules.values()), len(self.rules) - self._rules_sized)
        self._rules_sized = len(self.rules)
        limit = self.stop_when_grammar
        assert limit is not None
        if any(ra.size(body) > limit for body in added):
            raise _GrammarDecided()

    def piece(self, node: ra.Node, ruled: bool = False) -> ra.Node:
        """`node` as a rule of its own where it is large (or, with `ruled`, holds a rule) and lexes alone."""
        large = self.rule_size is not None and ra.size(node) > self.rule_size
        if not (large or (ruled and ra.refs(node) and not isinstance(node, ra.Ref))) or not lexes_alone(node):
            return node
        name = f"{PIECE}{self._piece_count}"  # not len(_pieces): a recursion may have cached this key
        self._piece_count += 1
        self.rules[name] = node
        return ra.Ref(name)

    def _compile(self, schema: dict, path: str) -> ra.Node:
        if (report := unchecked_format(schema, path)) is not None:
            self.unenforced.append(report)
        s = normalize(schema, KNOWN_FORMATS)
        for key in _UNSUPPORTED:
            if key in s:
                raise ValueError(f"json_schema keyword {key!r} at {path} is not supported")
        if not s:
            return self.any_value()
        if "$ref" in s:
            return self.with_ref(s, path)
        if "allOf" in s:
            return all_of(self, s, path)
        if "dependentRequired" in s or "dependentSchemas" in s:
            return self.compile(dependencies_as_all_of(s, path), path)
        if "if" in s:
            rest = {k: v for k, v in s.items() if k not in ("if", "then", "else")}
            cond = [{"allOf": [s["if"], s.get("then", True)]}, {"allOf": [{"not": s["if"]}, s.get("else", True)]}]
            return self.compile({**rest, "allOf": [{"anyOf": cond}]}, path)
        for key in ("anyOf", "oneOf"):
            if key in s:
                return combinator(self, key, s, path)
        if "not" in s:
            return negated(self, s, path)
        if "enum" in s or "const" in s:
            return enum(self, s, path)
        types = s.get("type", infer_type(s))
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
        if ra.Ref(ANY_VALUE) in nodes:  # one holds every JSON value: the others add nothing (and would
            return ra.Ref(ANY_VALUE)  # be a second parse of their values)
        nodes = self.split_alike(nodes, lambda i: makers[i]())
        return ra.alt(*self.merge_containers(nodes))

    def typed(self, t: str, s: dict, path: str) -> ra.Node:
        if t == "object":
            return object_node(self, s, path)
        if t == "array":
            return array_node(self, s, path)
        if t == "string":
            return string_schema(self, s, path)
        if t in ("integer", "number"):
            return number_schema(self, t, s, path)
        if t == "boolean":
            return ra.alt(ra.literal("true"), ra.literal("false"))
        return ra.literal("null")

    # ---- references -----------------------------------------------------------------------------
    def ref(self, ref: object, path: str) -> ra.Node:
        key, target = self.refs.resolve(ref, path)
        return self.named(key, target, self._rule_name(key), key)

    def named(self, key: str, target: object, name: str, path: str) -> ra.Node:
        """`target` compiled once per `key` (and split mode: an inline body remade split must not come
        back unsplit from the memo); met again inside its own compilation, it is the rule `name`."""
        # inside an exact language an undeclared value is bounded, not the marker: a reference compiled outside reads
        # differently there
        bounded = self.bounded_any or (self.exact_depth and self.lazy is not None)
        memo = ("split:" if self._split_all else "") + ("strict:" if self.strict and not self.strict_root else "") \
            + ("bounded:" if bounded else "") + key
        hit = self._inline.get(memo)
        if hit is None and isinstance(self._inline.get(key), ra.Ref):  # a rule reads alike in either mode
            hit = self._inline[key]
        if hit is not None:
            return hit
        if key in self.open_refs:
            self._recursive.add(key)
            return ra.Ref(name)
        self.open_refs.add(key)
        self.pending_firsts[name] = type_first_chars(target)
        try:
            body = self.compile(target, path)
        finally:
            self.open_refs.discard(key)
        if key in self._recursive:
            self.rules[name] = body
            node: ra.Node = ra.Ref(name)
        else:
            node = body
        self._inline[memo] = node
        return node

    def with_ref(self, s: dict, path: str) -> ra.Node:
        rest = {k: v for k, v in s.items() if k != "$ref"}
        if not rest:
            return self.ref(s["$ref"], path)
        return all_of(self, {**rest, "allOf": [{"$ref": s["$ref"]}]}, path)

    def _rule_name(self, ref: str) -> str:
        slug = "".join(c if c.isalnum() else "_" for c in ref[1:]).strip("_").lower()
        return f"ref_{slug}" if slug else "ref_root"

    # ---- any value ----------------------------------------------------------------------------
    def undeclared_value(self) -> ra.Node:
        """The value of a property the schema says nothing about: any JSON value, as a rule where the schema is a
        grammar anyway, else in the regex with its deeper containers a marker object_dispatch lays (lazy mode);
        where a marker cannot be, any value nesting at most UNDECLARED_VALUE_DEPTH deep."""
        if self.any_undeclared:
            return self.any_value()
        if (self.lazy is not None and not self.exact_depth and not self.bounded_any
                and ANY_MARKER_PATH not in self.not_lazy):
            self.lazy_any = True
            return _any_value(self.ws, True)
        return self.bounded_value()

    def bounded_value(self) -> ra.Node:
        return _any_value(self.ws, False)

    def any_value(self) -> ra.Node:
        if self.bounded_any:
            return self.bounded_value()
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
