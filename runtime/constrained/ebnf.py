"""SGLang's `ebnf` constraint: XGrammar's EBNF dialect (GBNF-like) -> regex trees with rule references.

    root ::= item ("," item)*          # `root` is the start rule; a rule may span lines
    item ::= [a-z]+ | "\"" [^"]* "\"" | "(" root ")"

Strings "..." (escapes \\n \\r \\t \\" \\\\ \\xHH \\uHHHH \\UHHHHHHHH), classes [a-z] / [^...], `.` (any
character), grouping, `|`, and the postfixes `*` `+` `?` `{m}` `{m,}` `{m,n}`; `#` starts a comment.
XGrammar's lookahead assertions `(= ...)` and built-in macros are refused with a message.

Rules that take part in no cycle are inlined, so a regular grammar becomes one regex (a plain DFA);
recursive rules stay `Ref`s for rule_grammar's LALR(1) table. The parse is characters, not tokens:
like XGrammar, a string or class matches text exactly, with no whitespace skipped between items.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from .regex import regex_ast as ra

FIELD = "ebnf"
ROOT = "root"
_NAME_START = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ_"
_NAME_CHARS = _NAME_START + "0123456789-"
_SIMPLE_ESCAPES = {"n": "\n", "r": "\r", "t": "\t", "0": "\0", "f": "\f", "v": "\v", "b": "\b", "a": "\a"}
_HEX_ESCAPES = {"x": 2, "u": 4, "U": 8}
_ANY = ra.chars(ra.complement(()))  # every code point but the surrogates


@dataclass(frozen=True)
class EbnfGrammar:
    root: ra.Node  # `root` with every non-recursive rule inlined
    rules: dict[str, ra.Node]  # the recursive rules, by name (their bodies may hold `Ref`s)


def parse_ebnf(text: str) -> EbnfGrammar:
    """The grammar's root and recursive rules. Raises ValueError naming the field and the position."""
    if not isinstance(text, str):
        raise ValueError(f"{FIELD} must be a string, got {type(text).__name__}")
    try:
        rules = _Parser(text).grammar()
        if ROOT not in rules:
            raise ValueError(f"{FIELD}: the grammar has no `{ROOT}` rule (its start rule)")
        for name, body in rules.items():
            missing = sorted(ra.refs(body) - set(rules))
            if missing:
                raise ValueError(f"{FIELD}: rule `{name}` refers to undefined rule(s) {missing}")
        return _inline(rules)
    except RecursionError:  # parsing and inlining recurse once per nesting level
        raise ValueError(f"{FIELD}: the grammar nests too deeply") from None


def _inline(rules: dict[str, ra.Node]) -> EbnfGrammar:
    """Substitutes every rule that cannot reach itself; keeps `Ref`s only to recursive rules."""
    reach = {name: set(ra.refs(body)) for name, body in rules.items()}
    grew = True
    while grew:  # transitive closure of "refers to" (grammars are small)
        grew = False
        for name, targets in reach.items():
            more = set().union(*(reach[t] for t in targets)) - targets
            if more:
                targets |= more
                grew = True
    recursive = {name for name, targets in reach.items() if name in targets}
    inlined: dict[str, ra.Node] = {}

    def body(name: str) -> ra.Node:
        return _substitute(rules[name], lambda ref: ra.Ref(ref) if ref in recursive else inline(ref))

    def inline(name: str) -> ra.Node:  # terminates: a non-recursive rule never reaches itself
        if name not in inlined:
            inlined[name] = body(name)
        return inlined[name]

    kept = {name: body(name) for name in sorted(recursive & (reach[ROOT] | {ROOT}))}
    return EbnfGrammar(ra.Ref(ROOT) if ROOT in recursive else inline(ROOT), kept)


def _substitute(node: ra.Node, ref: Callable[[str], ra.Node]) -> ra.Node:
    if isinstance(node, ra.Ref):
        return ref(node.name)
    if isinstance(node, ra.Seq):
        return ra.seq(*(_substitute(x, ref) for x in node.items))
    if isinstance(node, ra.Alt):
        return ra.alt(*(_substitute(x, ref) for x in node.items))
    if isinstance(node, ra.Repeat):
        return ra.repeat(_substitute(node.item, ref), node.min, node.max)
    return node  # Chars: no references inside


class _Parser:
    """Recursive descent over the grammar's characters; each method reads one construct."""

    def __init__(self, text: str):
        self.text, self.pos = text, 0

    def error(self, message: str) -> ValueError:
        line = self.text.count("\n", 0, self.pos) + 1
        column = self.pos - (self.text.rfind("\n", 0, self.pos) + 1) + 1
        return ValueError(f"{FIELD}: {message} at line {line}, column {column}")

    def peek(self, k: int = 1) -> str:
        return self.text[self.pos:self.pos + k]

    def skip_space(self) -> None:
        while self.pos < len(self.text):
            c = self.text[self.pos]
            if c == "#":
                end = self.text.find("\n", self.pos)
                self.pos = len(self.text) if end < 0 else end
            elif c.isspace():
                self.pos += 1
            else:
                return

    def grammar(self) -> dict[str, ra.Node]:
        rules: dict[str, ra.Node] = {}
        self.skip_space()
        if self.pos == len(self.text):
            raise self.error("the grammar is empty")
        while self.pos < len(self.text):
            name = self.name()
            self.skip_space()
            if self.peek(3) != "::=":
                raise self.error(f"expected `::=` after the rule name `{name}`")
            if name in rules:
                raise self.error(f"rule `{name}` is defined twice")
            self.pos += 3
            rules[name] = self.alternatives()
            self.skip_space()
            if self.pos < len(self.text) and not self.rule_starts():
                raise self.error(f"unexpected {self.peek()!r}")
        return rules

    def name(self) -> str:
        start = self.pos
        if self.peek() not in _NAME_START or not self.peek():
            raise self.error(f"expected a rule name, got {self.peek() or 'the end'!r}")
        while self.pos < len(self.text) and self.text[self.pos] in _NAME_CHARS:
            self.pos += 1
        return self.text[start:self.pos]

    def rule_starts(self) -> bool:
        """Whether a `name ::=` begins here (so the rule before it has ended)."""
        start = self.pos
        try:
            if not self.peek() or self.peek() not in _NAME_START:
                return False
            self.name()
            self.skip_space()
            return self.peek(3) == "::="
        finally:
            self.pos = start

    def alternatives(self) -> ra.Node:
        options = [self.sequence()]
        while True:
            self.skip_space()
            if self.peek() != "|":
                return ra.alt(*options)
            self.pos += 1
            options.append(self.sequence())

    def sequence(self) -> ra.Node:
        items: list[ra.Node] = []
        while True:
            self.skip_space()
            c = self.peek()
            if c in ("", "|", ")") or self.rule_starts():
                return ra.seq(*items)
            items.append(self.postfixed(self.primary()))

    def primary(self) -> ra.Node:
        c = self.peek()
        if c in "\"'":
            return self.string(c)
        if c == "[":
            return self.char_class()
        if c == ".":
            self.pos += 1
            return _ANY
        if c == "(":
            if self.peek(2) == "(=":
                raise self.error("lookahead assertions `(= ...)` are not supported")
            self.pos += 1
            inner = self.alternatives()
            self.skip_space()
            if self.peek() != ")":
                raise self.error("expected `)`")
            self.pos += 1
            return inner
        if c in _NAME_START:
            start = self.pos
            name = self.name()
            if self.peek() == "(":
                self.pos = start
                raise self.error(f"built-in macros like `{name}(...)` are not supported")
            return ra.Ref(name)
        raise self.error(f"unexpected {c!r}")

    def postfixed(self, node: ra.Node) -> ra.Node:
        while True:
            c = self.peek()
            if c == "*":
                node = ra.repeat(node, 0, None)
            elif c == "+":
                node = ra.repeat(node, 1, None)
            elif c == "?":
                node = ra.optional(node)
            elif c == "{":
                lo, hi = self.bounds()
                node = ra.repeat(node, lo, hi)
                continue
            else:
                return node
            self.pos += 1

    def bounds(self) -> tuple[int, int | None]:
        close = self.text.find("}", self.pos)
        body = self.text[self.pos + 1:close] if close > 0 else ""
        lo_text, comma, hi_text = body.replace(" ", "").partition(",")
        if close < 0 or not lo_text.isdigit() or (hi_text and not hi_text.isdigit()):
            raise self.error("a repetition is {m}, {m,} or {m,n} with whole numbers")
        lo = int(lo_text)
        hi = lo if not comma else int(hi_text) if hi_text else None
        if hi is not None and hi < lo:
            raise self.error(f"a repetition {{{lo},{hi}}} needs m <= n")
        self.pos = close + 1
        return lo, hi

    def string(self, quote: str) -> ra.Node:
        self.pos += 1
        out: list[str] = []
        while True:
            c = self.peek()
            if c == "":
                raise self.error("unterminated string")
            if c == quote:
                self.pos += 1
                return ra.literal("".join(out))
            if c == "\n":
                raise self.error("a string may not hold a raw newline (write \\n)")
            out.append(self.char())

    def char_class(self) -> ra.Node:
        self.pos += 1
        negated = self.peek() == "^"
        self.pos += negated
        ranges = []
        while self.peek() != "]":
            if self.peek() == "":
                raise self.error("unterminated character class")
            start = self.pos
            lo = hi = self.char()
            if self.peek() == "-" and self.text[self.pos + 1:self.pos + 2] not in ("]", ""):  # else a literal -
                self.pos += 1
                hi = self.char()
                if ord(hi) < ord(lo):
                    self.pos = start
                    raise self.error(f"the class range {lo!r}-{hi!r} is reversed")
            ranges.append((ord(lo), ord(hi)))
        self.pos += 1
        normal = ra.normalize(ranges)
        return ra.chars(ra.complement(normal) if negated else normal)

    def char(self) -> str:
        """One character of a string or class, escapes decoded."""
        c = self.peek()
        self.pos += 1
        if c != "\\":
            return c
        e = self.peek()
        self.pos += 1
        if e in _SIMPLE_ESCAPES:
            return _SIMPLE_ESCAPES[e]
        if e in _HEX_ESCAPES:
            digits = self.text[self.pos:self.pos + _HEX_ESCAPES[e]]
            try:
                code = int(digits, 16) if len(digits) == _HEX_ESCAPES[e] else -1
            except ValueError:
                code = -1
            if not 0 <= code <= ra.MAX_CODE_POINT:
                raise self.error(f"\\{e} needs {_HEX_ESCAPES[e]} hex digits of a code point")
            self.pos += _HEX_ESCAPES[e]
            return chr(code)
        if e == "":
            raise self.error("a `\\` ends the grammar")
        return e  # \" \\ \] \- \[ ... : the character itself
