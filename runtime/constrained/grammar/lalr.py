"""LALR(1) tables we drive incrementally, and Lark grammars -> a table plus a regex tree per terminal.

For Lark grammars Lark builds the table (and resolves `%import common`, templates, priorities); we
only read it. JSON-schema rules build theirs directly (rule_grammar, lr_table).

A parser stack is a number: the table numbers each (state, parent stack) pair it meets, once, so copies
are free, equal stacks are equal numbers, and a stack keys a cache in O(1) whatever its depth (a linked
tuple hashed its whole depth per lookup). Shifts are kept per (stack, terminal): a decode meets the same
stacks again and again.

A table built with `forks` (JSON-schema and EBNF rules) keeps both reductions where two rules reduce on one
lookahead (an `anyOf` of two objects that both read `{}`; a text that only a later lexeme tells apart), as a
GLR parser does: the feed that meets one goes on with each, and the live stacks it leaves are numbered
together as one stack, a fork, whose feed is its members' (dead ones dropped, equal ones merged, so a fork
ends where the readings meet again). Its acceptable terminals are its members' together, so one lexer reads
for all; at most MAX_FORK_STACKS members are kept, the first in reading order (never more accepted, and the
same whatever the table met before).
"""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ..regex import regex_ast as ra
from ..regex.regex_parser import parse_regex

if TYPE_CHECKING:
    from lark.lexer import TerminalDef
    from lark.parsers.lalr_analysis import ParseTableBase

Stack = int  # a stack's number in its table (LalrTable.top, LalrTable.parent)
END = "$END"
FORK = None  # an action's kind beside shift (True) and reduce (False): reductions (size, rule) to follow each
MAX_FORK_STACKS = 32  # live readings a fork keeps (a truly ambiguous union nested d deep has 2^d)

# Lark's common.ESCAPED_STRING uses a look-behind; this is the same language, written regularly.
_LARK_ESCAPED_STRING = r'".*?(?<!\\)(\\\\)*?"'
_REGULAR_ESCAPED_STRING = r'"(?:[^"\\\n]|\\[^\n])*"'


@dataclass(frozen=True, slots=True)
class Terminal:
    name: str
    node: ra.Node
    rank: tuple  # lower ranks win when two terminals accept the same lexeme


@dataclass(slots=True)
class LalrTable:
    """Shift/reduce actions by state and symbol: (True, next state) shifts a terminal or is a rule's
    goto; (False, (size, rule)) reduces; (FORK, ((size, rule), ...)) reduces each way (a reduce/reduce
    conflict kept). Built by Lark for Lark grammars, by `lr_table` for rules."""

    actions: dict[int, dict[str, tuple[bool | None, Any]]]  # the kind: True, False or FORK (None)
    start: int
    end: int  # the state after the whole input has reduced to the start rule

    @classmethod
    def from_lark(cls, parse_table: ParseTableBase[int], start: str = "start") -> "LalrTable":
        from lark.parsers.lalr_analysis import Shift

        actions: dict[int, dict[str, tuple[bool | None, Any]]] = {
            state: {sym: (True, arg) if action is Shift else (False, (len(arg.expansion), arg.origin.name))
                    for sym, (action, arg) in row.items()}
            for state, row in parse_table.states.items()
        }
        return cls(actions, parse_table.start_states[start], parse_table.end_states[start])

    symbols: list[str] = field(default_factory=list)  # by state: the symbol read to reach it (lr_table's)
    # by rule: a check of the stack before it reduces (the stack, the production's size); False vetoes the
    # terminal that made it reduce (member_check: a JSON key written twice, an object closed too early)
    guards: dict[str, Callable[["LalrTable", int, int], bool]] = field(default_factory=dict)
    # by rule: a number its reduced node carries (0 unless asked), read by guards below it (member_check)
    annotators: dict[str, Callable[["LalrTable", int, int], int]] = field(default_factory=dict)
    # by stack: (top state, parent stack; -1: none, tag); a fork's is (-1, -1, 0)
    _nodes: list[tuple[int, int, int]] = field(default_factory=list)
    _numbers: dict[tuple, Stack] = field(default_factory=dict)  # _nodes' inverse, and forks' by members
    _members: dict[Stack, tuple[Stack, ...]] = field(default_factory=dict)  # a fork's stacks, in reading order
    _feeds: dict[tuple[Stack, str | tuple[str, ...]], Stack] = field(default_factory=dict)  # feed('s_each), -1: error
    _ends: dict[Stack, bool] = field(default_factory=dict)  # accepts_end's
    _lock: threading.Lock = field(default_factory=threading.Lock)  # numbering: constraints are shared by threads

    def initial(self) -> Stack:
        return self._push(self.start, -1)

    @property
    def size(self) -> int:
        """The stacks numbered so far (what every per-stack cache of a constraint grows with)."""
        return len(self._nodes)

    def top(self, stack: Stack) -> int:
        return self._nodes[stack][0]

    def parent(self, stack: Stack) -> Stack | None:
        below = self._nodes[stack][1]
        return None if below < 0 else below

    def members(self, stack: Stack) -> tuple[Stack, ...]:
        """The plain stacks a stack stands for: a fork's, or itself."""
        return self._members.get(stack, (stack,))

    def tag(self, stack: Stack) -> int:
        return self._nodes[stack][2]

    def _push(self, state: int, parent: Stack, tag: int = 0) -> Stack:
        key = (state, parent, tag)
        number = self._numbers.get(key)
        if number is None:
            with self._lock:
                number = self._numbers.get(key)
                if number is None:
                    number = self._numbers[key] = len(self._nodes)
                    self._nodes.append(key)
        return number

    def feed(self, stack: Stack, terminal: str) -> Stack | None:
        """The stack after shifting `terminal` (with any reductions first), or None if it is an error."""
        nxt = self._fed(stack, terminal)
        return None if nxt < 0 else nxt

    def feed_each(self, stack: Stack, terminals: tuple[str, ...]) -> Stack | None:
        """`feed` of a lexeme that reads as each of `terminals` (two terminals of a grammar that match one text):
        the stacks of those that parse, as one (a fork where several do)."""
        if len(terminals) == 1:
            return self.feed(stack, terminals[0])
        key = (stack, terminals)
        nxt = self._feeds.get(key)
        if nxt is None:
            nxt = self._feeds[key] = self._fork([self._fed(stack, t) for t in terminals])
        return None if nxt < 0 else nxt

    def _fed(self, stack: Stack, terminal: str) -> Stack:
        key = (stack, terminal)
        nxt = self._feeds.get(key)
        if nxt is None:
            nxt = self._feeds[key] = self._feed(stack, terminal)
        return nxt

    def _feed(self, stack: Stack, terminal: str, seen: tuple[Stack, ...] = ()) -> Stack:
        """`seen`: the stacks a fork's reductions went through on the way here (a cycle of reductions back to one
        of them adds no reading)."""
        members = self._members.get(stack)
        if members is not None:
            return self._fork([self._fed(m, terminal) for m in members])
        while True:
            act = self.actions[self._nodes[stack][0]].get(terminal)
            if act is None:
                return -1
            kind, arg = act
            if kind:
                return self._push(arg, stack)
            if kind is FORK:  # each reduction its guard allows
                seen = (*seen, stack)
                return self._fork([self._feed(nxt, terminal, seen) for r in arg
                                   if self._guarded(stack, *r) and (nxt := self._reduce(stack, *r)) not in seen])
            if not self._guarded(stack, *arg):
                return -1
            stack = self._reduce(stack, *arg)

    def _fork(self, stacks: list[Stack]) -> Stack:
        """One stack for the live ones (-1: none): members flattened, in order, equal ones once."""
        live = (m for s in stacks if s >= 0 for m in self.members(s))
        members = tuple(dict.fromkeys(live))[:MAX_FORK_STACKS]
        if len(members) <= 1:
            return members[0] if members else -1
        key = ("fork", members)
        number = self._numbers.get(key)
        if number is None:
            with self._lock:
                number = self._numbers.get(key)
                if number is None:  # its members first: a thread reading the number unlocked finds them
                    number = len(self._nodes)
                    self._members[number] = members
                    self._nodes.append((-1, -1, 0))
                    self._numbers[key] = number
        return number

    def accepts_end(self, stack: Stack) -> bool:
        done = self._ends.get(stack)
        if done is None:
            done = self._ends[stack] = self._accepts_end(stack)
        return done

    def _accepts_end(self, stack: Stack, seen: tuple[Stack, ...] = ()) -> bool:
        members = self._members.get(stack)
        if members is not None:
            return any(self.accepts_end(m) for m in members)
        while True:
            act = self.actions[self._nodes[stack][0]].get(END)
            if act is None or act[0]:
                return False
            if act[0] is FORK:
                seen = (*seen, stack)
                return any(self._nodes[nxt][0] == self.end or self._accepts_end(nxt, seen) for r in act[1]
                           if self._guarded(stack, *r) and (nxt := self._reduce(stack, *r)) not in seen)
            if not self._guarded(stack, *act[1]):
                return False
            stack = self._reduce(stack, *act[1])
            if self._nodes[stack][0] == self.end:
                return True

    def _guarded(self, stack: Stack, size: int, origin: str) -> bool:
        guard = self.guards.get(origin)
        return guard is None or guard(self, stack, size)

    def _reduce(self, stack: Stack, size: int, origin: str) -> Stack:
        annotate = self.annotators.get(origin)
        tag = annotate(self, stack, size) if annotate is not None else 0
        for _ in range(size):
            stack = self._nodes[stack][1]
        return self._push(self.actions[self._nodes[stack][0]][origin][1], stack, tag)

    def candidates(self, stack: Stack) -> list[str]:
        members = self._members.get(stack)
        if members is not None:
            return list(dict.fromkeys(sym for m in members for sym in self.actions[self._nodes[m][0]]))
        return list(self.actions[self._nodes[stack][0]])


@dataclass(slots=True)
class LalrGrammar:
    table: LalrTable
    terminals: dict[str, Terminal]
    ignore: frozenset[str]
    readings: bool = False  # a lexeme every terminal matches is read as each (rules); else the preferred (Lark's)


def build_lark(text: str) -> LalrGrammar:
    """Compiles a Lark grammar (start rule `start`)."""
    if not isinstance(text, str) or not text.strip():
        raise ValueError("grammar must be a non-empty Lark grammar string")
    import lark  # only grammars need it: an engine without grammars runs where lark is not installed
    from lark.exceptions import GrammarError, LarkError

    try:
        parser = lark.Lark(text, parser="lalr", lexer="contextual", start="start")
    except GrammarError as e:
        raise ValueError(f"grammar is malformed or not LALR(1): {e}") from None
    except LarkError as e:
        raise ValueError(f"invalid Lark grammar: {e}") from None
    table = LalrTable.from_lark(parser.parser.parser.parser.parse_table)
    terminals = {t.name: Terminal(t.name, _terminal_node(t), _rank(t)) for t in parser.terminals}
    return LalrGrammar(table, terminals, frozenset(parser.ignore_tokens))


def _terminal_node(t: TerminalDef) -> ra.Node:
    pattern = t.pattern
    if pattern.type == "str" and not pattern.flags:
        return ra.literal(pattern.value)
    regex = pattern.to_regexp()  # carries the terminal's flags as an inline group
    if regex == _LARK_ESCAPED_STRING:
        regex = _REGULAR_ESCAPED_STRING
    try:
        return parse_regex(regex)
    except ValueError as e:
        raise ValueError(f"grammar terminal {t.name}: {e}") from None


def _rank(t: TerminalDef) -> tuple:
    """Lark's preference: higher priority, then string literals over regexps, then longer literals."""
    literal = t.pattern.type == "str"
    return (-t.priority, not literal, -len(t.pattern.value) if literal else 0, t.name)
