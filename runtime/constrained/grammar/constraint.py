"""Context-free constraints: an incremental LALR(1) parse over lexemes read by per-terminal DFAs.

State = (parser stack, ignored-lexeme run, lexer DFA state). The lexer for a state reads exactly
the terminals the parser would accept next (found by trial-feeding each candidate, reductions
included), so every live lexeme can complete into a terminal the parse accepts: no dead ends.
Lexing is longest-match, as in Lark: a lexeme ends only where no allowed terminal can go on.

A token's mask bit comes from three places, all vectorised over the vocabulary:
- tokens that stay inside the current lexeme (the lexer's precomputed token index);
- tokens that end the lexeme part-way and go on into the next one (index boundaries: the next
  lexeme's DFA walks their remaining bytes);
- when the lexeme so far is complete, tokens that could not extend it but start the next one.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Hashable

import numpy as np

from ...config import LARK_MAX_CONSECUTIVE_IGNORED, LARK_MAX_IGNORED_BYTES, MAX_NFA_STATES
from ..masks.token_index import TokenIndex
from ..masks.vocab import TokenVocab
from ..matcher import MaskCache
from ..regex import regex_ast as ra
from ..regex.automaton import Dfa, collector_paused, compile_dfa, compiled_before
from ..regex.dfa_cache import caching, current
from ..regex.fsa import ConstraintTooLarge
from ..warming import byte_edges
from .lalr import LalrGrammar, Stack
from .lexer_probe import LexerProbe, Piece, Suffixes

# Any JSON value, with whitespace allowed between tokens (Lark's JSON example grammar).
JSON_GRAMMAR = r"""
start: value
?value: dict | list | ESCAPED_STRING | SIGNED_NUMBER | "true" | "false" | "null"
list : "[" [value ("," value)*] "]"
dict : "{" [pair ("," pair)*] "}"
pair : ESCAPED_STRING ":" value
%import common.ESCAPED_STRING
%import common.SIGNED_NUMBER
%import common.WS
%ignore WS
"""
SUFFIX_CACHE_SIZE = 8192  # suffix walks kept per grammar (a few hundred row ids each); past it they start over
# rows a lexer's probe walks (in Python, a byte at a time) before the lexer is built and walked natively
# instead: a probe pays where a few tokens' few bytes are read (a build costs 2-40 ms)
PROBE_MAX_ROWS = 2048
STATE_KEY_CACHE_SIZE = 16384  # states whose mask key (or lexer-state bits, shared) is kept; past it they start over
State = tuple[Stack, int, int]  # (parser stack, ignored lexemes in a row, lexer DFA state)
# Parser stacks a cached constraint may number (each keeps its shifts, acceptable terminals and lexer: ~1 KB)
# before the compiler stops handing it out and compiles a fresh one: a recursive grammar meets new stacks with
# every new nesting, and a long-lived server must not keep them all (growing_dfa.MAX_GROWN_STATES' rule).
MAX_GRAMMAR_STACKS = 65_536


@dataclass(eq=False)
class Lexer:
    terminals: tuple[tuple[str, ...], ...]  # by accept label: the terminal it reads (by preference), or, in a
    # grammar that reads every way (rule grammars), each terminal the lexeme matches: the parse follows each
    dfa: Dfa
    index: TokenIndex


class GrammarConstraint:
    unenforced: tuple[str, ...] = ()  # a JSON schema's relaxed keywords (compiler.unenforced)
    # warming.py may stop it anywhere (a deadline raised inside a lexer's or a probe's automaton build): each of its
    # caches takes an entry only once that entry is computed whole, and only those builds read the clock
    warm_interruptible = True

    def __init__(self, grammar: LalrGrammar, vocab: TokenVocab):
        self.grammar, self.vocab = grammar, vocab
        self.table = grammar.table
        self._lexers: dict[frozenset[str], Lexer] = {}
        self._acceptable: dict[Stack, frozenset[str]] = {}
        self._lexer_at: dict[tuple[Stack, bool], Lexer] = {}  # by (stack, may an ignored lexeme come)
        self._key_at: dict[tuple[Stack, bool], frozenset[str]] = {}  # the terminals its lexer reads, by the same
        self._probes: dict[frozenset[str], LexerProbe] = {}  # lexers suffix walks read before any decode built them
        self._probe_pieces: dict[ra.Node, Piece] = {}  # the probes' per-terminal pieces, shared by them
        self._state_keys: dict[State, Hashable | np.ndarray] = {}  # allowed_bits': a state's mask key, or its bits where no key
        self._masks = MaskCache()  # by mask key; lexers are built on first use: compiling pays only for the first mask's
        self._groups: dict[tuple[Lexer, int], list[tuple[int, int, np.ndarray]]] = {}  # _boundary_groups'
        self._suffixes: dict[tuple[frozenset[str], Hashable], Suffixes] = {}  # _suffix_walk's, by (lexer, key)
        self._walks: dict[Hashable, Suffixes] = {}  # the same, by what they read (`_walk_key`)
        self._dfas = current()  # the compiler's automata cache, for lexers built later, mid-decode
        self._check_lexer_sizes()
        stack = self.table.initial()
        self._initial: State = (stack, 0, self.lexer(stack, 0).dfa.start)

    def _check_lexer_sizes(self) -> None:
        """Refuses, now rather than mid-decode, a grammar with a lexer too large to build: a lexer reads
        some of the terminals in its parser state's row (plus the ignored ones), and its automaton has
        about as many NFA states as their trees together."""
        size = {name: ra.size(t.node) for name, t in self.grammar.terminals.items()}
        ignored = sum(size[name] * LARK_MAX_IGNORED_BYTES for name in self.grammar.ignore)
        for row in self.table.actions.values():
            total = ignored + sum(size.get(sym, 0) for sym in row)
            if total > MAX_NFA_STATES:
                names = sorted(sym for sym in row if sym in size)
                raise ConstraintTooLarge(f"constraint is too large: the lexer for terminals {names[:8]} would "
                                         f"exceed {MAX_NFA_STATES} NFA states (about {total})")

    @property
    def outgrown(self) -> bool:
        """Whether its table numbered more than MAX_GRAMMAR_STACKS stacks: the compiler's cache then compiles a
        fresh one (requests holding this one finish on it)."""
        return self.grown_share > 1

    @property
    def grown_share(self) -> float:
        """Its stacks as a share of MAX_GRAMMAR_STACKS (warming.py stops at a fraction of it)."""
        return self.table.size / MAX_GRAMMAR_STACKS

    # ---- parser side ----------------------------------------------------------------------
    def acceptable(self, stack: Stack) -> frozenset[str]:
        hit = self._acceptable.get(stack)
        if hit is None:
            terms = self.grammar.terminals
            hit = frozenset(t for t in self.table.candidates(stack)
                            if t in terms and self.table.feed(stack, t) is not None)
            self._acceptable[stack] = hit
        return hit

    def lexer(self, stack: Stack, run: int) -> Lexer:
        at = (stack, run < LARK_MAX_CONSECUTIVE_IGNORED)
        lex = self._lexer_at.get(at)
        if lex is None:
            key = self.lexer_key(stack, run)
            lex = self._lexers.get(key)
            if lex is None:
                lex = self._lexers[key] = self._build_lexer(key)
            self._lexer_at[at] = lex
        return lex

    def lexer_key(self, stack: Stack, run: int) -> frozenset[str]:
        """The terminals `lexer(stack, run)` reads (it names the lexer without building it)."""
        at = (stack, run < LARK_MAX_CONSECUTIVE_IGNORED)
        key = self._key_at.get(at)
        if key is None:
            key = self.acceptable(stack)
            if at[1]:
                key = key | self.grammar.ignore
            self._key_at[at] = key
        return key

    def _lexer_nodes(self, names: frozenset[str]) -> tuple[list[str], list[ra.Node]]:
        """The terminals of a lexer in preference order, and their trees (ignored ones bounded)."""
        terms = sorted((self.grammar.terminals[n] for n in names), key=lambda t: t.rank)
        return [t.name for t in terms], [ra.Bounded(t.node, LARK_MAX_IGNORED_BYTES) if t.name in self.grammar.ignore
                                         else t.node for t in terms]

    def _build_lexer(self, names: frozenset[str]) -> Lexer:
        order, nodes = self._lexer_nodes(names)
        readings = self.grammar.readings
        with collector_paused(), caching(self._dfas):  # built mid-decode too (lexers are built on first use)
            dfa = compile_dfa(nodes, nonempty=True, readings=readings)
        labels = tuple(tuple(order[i] for i in r) for r in dfa.readings) if readings else tuple((n,) for n in order)
        return Lexer(labels, dfa, TokenIndex(dfa, self.vocab, boundaries=True))

    def _after_lexeme(self, stack: Stack, run: int, terminals: tuple[str, ...]) -> tuple[Stack, int] | None:
        """After a lexeme that reads as `terminals` (Lexer.terminals' entry): each that parses, a fork if several."""
        if terminals[0] in self.grammar.ignore:
            return stack, run + 1
        nxt = self.table.feed_each(stack, terminals)
        return None if nxt is None else (nxt, 0)

    # ---- the Constraint protocol ------------------------------------------------------------
    def initial(self) -> State:
        return self._initial

    def advance(self, state: State, token_id: int) -> State | None:
        stack, run, q = state
        lex = self.lexer(stack, run)
        data = self.vocab.bytes_of(token_id)
        if lex.index.allows(q, token_id):
            return (stack, run, lex.dfa.walk(q, data))
        return self.advance_bytes(state, data) if data else None

    def advance_bytes(self, state: State, data: bytes) -> State | None:
        for b in data:
            nxt = self._step(state, b)
            if nxt is None:
                return None
            state = nxt
        return state

    def _step(self, state: State, b: int) -> State | None:
        stack, run, q = state
        lex = self.lexer(stack, run)
        nxt = lex.dfa.step(q, b)
        if nxt >= 0:
            return (stack, run, nxt)
        label = int(lex.dfa.accept[q])
        if label < 0:
            return None
        after = self._after_lexeme(stack, run, lex.terminals[label])
        if after is None:
            return None
        lex2 = self.lexer(*after)
        nxt = lex2.dfa.step(lex2.dfa.start, b)
        return None if nxt < 0 else (*after, nxt)

    def warm_edges(self, state: State) -> list[tuple[State, int, bool]]:
        """The states one byte on from `state` (warming.py's): its lexer's, and where its lexeme is complete, the
        next lexer's start (whose mask this one's reads)."""
        stack, run, q = state
        lex = self.lexer(stack, run)
        out: list[tuple[State, int, bool]] = [((stack, run, t), 0, rare) for t, rare in byte_edges(lex.dfa.row(q))]
        label = int(lex.dfa.accept[q])
        if label >= 0 and (after := self._after_lexeme(stack, run, lex.terminals[label])) is not None:
            out.append(((*after, self.lexer(*after).dfa.start), 0, False))
        return out

    def can_end(self, state: State) -> bool:
        stack, run, q = state
        lex = self.lexer(stack, run)
        if q == lex.dfa.start:
            return self.table.accepts_end(stack)
        label = int(lex.dfa.accept[q])
        if label < 0:
            return False
        after = self._after_lexeme(stack, run, lex.terminals[label])
        return after is not None and self.table.accepts_end(after[0])

    def allowed(self, state: State) -> np.ndarray:
        return np.unpackbits(self.allowed_bits(state), count=self.vocab.size, bitorder="little").view(bool)

    def allowed_bits(self, state: State) -> np.ndarray:
        """The mask as shared packed bits, kept by what it reads of the parser (`_mask_key`), not by the whole
        stack: parser states alike where the mask looks share it, and most need no parser work at all."""
        hit = self._state_key(state)
        if isinstance(hit, np.ndarray):
            return hit
        return self._masks.get_bits(hit, lambda: self._compute_bits(state), self.vocab.size)

    def _state_key(self, state: State) -> Hashable | np.ndarray:
        """The state's mask key, or its lexer state's bits where it has none; kept by state."""
        hit = self._state_keys.get(state)
        if hit is None:
            key = self._mask_key(state)
            hit = self.lexer(*state[:2]).index.packed(state[2]) if key is None else key
            if len(self._state_keys) >= STATE_KEY_CACHE_SIZE:
                self._state_keys.clear()
            self._state_keys[state] = hit
        return hit

    def _mask_key(self, state: State) -> Hashable | None:
        """What `_compute_bits(state)` reads beside its lexer state (lexer, q): for each boundary group, the
        lexers its suffix walk goes through (None where the lexeme's terminal does not parse there); for a
        complete lexeme, the next lexeme's lexer and its start's own key. None: neither exists, so the mask is
        the lexer state's own bits whatever the stack (most states)."""
        stack, run, q = state
        lex = self.lexer(stack, run)
        groups = self._boundary_groups(lex, q)
        label = int(lex.dfa.accept[q])
        if not groups and label < 0:
            return None
        walks = tuple(None if (after := self._after_lexeme(stack, run, lex.terminals[lab])) is None
                      else self._suffix_key(after, rows, p, (lex, q, k)) for k, (lab, p, rows) in enumerate(groups))
        complete = None
        if label >= 0 and (after := self._after_lexeme(stack, run, lex.terminals[label])) is not None:
            nxt = self.lexer(*after)
            start = self._state_key((*after, nxt.dfa.start))  # kept: every state completing the lexeme asks
            complete = (nxt, None if isinstance(start, np.ndarray) else start)
        return lex, q, walks, complete

    def _suffix_key(self, after: tuple[Stack, int], rows: np.ndarray, p: int | np.ndarray, key: Hashable) -> Hashable:
        """What `_suffix_rows(after, rows, p, key)` reads of the parser: the lexers it walks through, nested."""
        names = self.lexer_key(*after)
        _, nested = self._suffix_walk(names, rows, p, key)
        return names, tuple(None if (nxt := self._after_lexeme(*after, terminals)) is None
                            else self._suffix_key(nxt, members, stop_pos, (key, names, terminals))
                            for terminals, members, stop_pos in nested)

    def _compute_bits(self, state: State) -> np.ndarray:
        """The mask as packed bits: the lexer state's own tokens, then the tokens that finish the lexeme
        and go on into the next one (bit operations on V/8 bytes, never a pass over V booleans)."""
        stack, run, q = state
        lex = self.lexer(stack, run)
        vocab = self.vocab
        bits = lex.index.packed(q).copy()
        allowed = []
        for k, (label, p, rows) in enumerate(self._boundary_groups(lex, q)):
            after = self._after_lexeme(stack, run, lex.terminals[label])
            if after is not None:
                allowed.append(self._suffix_rows(after, rows, p, (lex, q, k)))
        if allowed:
            ids = vocab.ids[np.concatenate(allowed)]
            np.bitwise_or.at(bits, ids >> 3, (1 << (ids & 7)).astype(np.uint8))
        label = int(lex.dfa.accept[q])
        if label >= 0:
            after = self._after_lexeme(stack, run, lex.terminals[label])
            if after is not None:  # tokens that cannot extend the lexeme but start the next one
                nxt = self.allowed_bits((*after, self.lexer(*after).dfa.start))
                bits |= nxt & vocab.starting_with(lex.dfa.row(q) < 0)
        return bits

    def _boundary_groups(self, lex: Lexer, q: int) -> list[tuple[int, int, np.ndarray]]:
        """The lexer state's boundary rows by (accepted label, position): a few groups of many tokens."""
        hit = self._groups.get((lex, q))
        if hit is None:
            rows, pos, labels = lex.index.boundaries(q)
            hit = []
            group = pos * len(lex.terminals) + labels
            if len(rows) and (group == group[0]).all():  # one group (often): no sort
                hit = [(int(labels[0]), int(pos[0]), rows)]
            elif len(rows):
                order = np.argsort(group, kind="stable")
                group = group[order]
                cuts = [0, *(np.flatnonzero(group[1:] != group[:-1]) + 1).tolist(), len(order)]
                hit = [(int(labels[order[a]]), int(pos[order[a]]), rows[order[a:b]]) for a, b in zip(cuts, cuts[1:])]
            self._groups[(lex, q)] = hit
        return hit

    def _suffix_rows(self, after: tuple[Stack, int], rows: np.ndarray, p: int | np.ndarray,
                     key: Hashable) -> np.ndarray:
        """Of `rows` (tokens that finish a lexeme after p bytes; `key` names them), those whose bytes from p
        on are a valid start of what follows it. Tokens that finish the next lexeme too go on into the one
        after, grouped by how it ended (each level reads at least a byte, so this ends)."""
        names = self.lexer_key(*after)
        ok, nested = self._suffix_walk(names, rows, p, key)
        out = [ok]
        for terminals, members, stop_pos in nested:
            nxt = self._after_lexeme(*after, terminals)
            if nxt is not None:
                out.append(self._suffix_rows(nxt, members, stop_pos, (key, names, terminals)))
        return np.concatenate(out) if len(out) > 1 else ok

    def _suffix_walk(self, names: frozenset[str], rows: np.ndarray, p: int | np.ndarray, key: Hashable) -> Suffixes:
        """`rows` walked from the start of the lexer reading `names` from p: those that stay alive, and those
        that end one of its lexemes part-way, by the terminals it reads as (sorted; with where). Kept by (lexer,
        key): many parser states share a lexer; and by what it reads (`_walk_key`)."""
        hit = self._suffixes.get((names, key))
        if hit is None:
            hit = self._walks.get(same := self._walk_key(names, rows, p))
            if hit is None:
                hit = self._walks[same] = self._new_walk(names, rows, p)
            if len(self._suffixes) >= SUFFIX_CACHE_SIZE:
                self._suffixes.clear()
                self._walks.clear()
            self._suffixes[(names, key)] = hit
        return hit

    @staticmethod
    def _walk_key(names: frozenset[str], rows: np.ndarray, p: int | np.ndarray) -> Hashable:
        """What a suffix walk reads: the lexer, the rows and where they start. Half the walks a cold decode
        asks for repeat one by these (groups of other lexers' states, or of other parser states' lexers, that
        end the same tokens at the same bytes) though their (lexer, key) differ."""
        start = p if isinstance(p, int) else (p.dtype.str, p.tobytes())
        return names, rows.dtype.str, rows.tobytes(), start

    def _new_walk(self, names: frozenset[str], rows: np.ndarray, p: int | np.ndarray) -> Suffixes:
        """`_suffix_walk`'s walk. A lexer no decode has built yet is probed instead (lexer_probe: its NFA walked,
        the same answers): such walks read few tokens' few bytes, and most such lexers are never reached (the
        comma after an object's last member)."""
        lex = self._lexers.get(names)
        probe = self._probes.get(names)
        # built instead where its automaton is cached, or where the probe's Python walks would cost more
        if lex is None and (probe.walked + len(rows) > PROBE_MAX_ROWS if probe is not None
                            else len(rows) > PROBE_MAX_ROWS or self._dfa_kept(names)):
            lex = self._lexers[names] = self._build_lexer(names)
        return self._probe(names).suffixes(self.vocab, rows, p) if lex is None else _walked(lex, rows, p)

    def _dfa_kept(self, names: frozenset[str]) -> bool:
        """Whether the lexer's automaton is in the compiler's cache (built while compiling): building it is cheap."""
        with caching(self._dfas):
            return compiled_before(self._lexer_nodes(names)[1], nonempty=True, readings=self.grammar.readings)

    def _probe(self, names: frozenset[str]) -> LexerProbe:
        probe = self._probes.get(names)
        if probe is None:  # as a lexer is built: the ignored terminals' DFAs (Bounded) are the compile's
            with collector_paused(), caching(self._dfas):
                probe = self._probes[names] = LexerProbe(*self._lexer_nodes(names)[::-1], self.grammar.readings,
                                                         self._probe_pieces)
        return probe

    def forced_bytes(self, state: State, limit: int) -> bytes:
        out = bytearray()
        while len(out) < limit and not self.can_end(state):
            b = self._only_next_byte(state)
            if b is None:
                break
            out.append(b)
            nxt = self._step(state, b)
            assert nxt is not None, "the only live next byte always steps"
            state = nxt
        return bytes(out)

    def _only_next_byte(self, state: State) -> int | None:
        stack, run, q = state
        lex = self.lexer(stack, run)
        live = lex.dfa.row(q) >= 0
        label = int(lex.dfa.accept[q])
        if label >= 0:
            after = self._after_lexeme(stack, run, lex.terminals[label])
            if after is not None:
                lex2 = self.lexer(*after)
                live = live | (lex2.dfa.row(lex2.dfa.start) >= 0)
        candidates = np.flatnonzero(live)
        return int(candidates[0]) if len(candidates) == 1 else None


def _walked(lex: Lexer, rows: np.ndarray, p: int | np.ndarray) -> Suffixes:
    """`GrammarConstraint._suffix_walk` through a built lexer (natively)."""
    walk = lex.index.walk_rows(rows, lex.dfa.start, p)
    labels = np.where(walk.end_state < 0, lex.dfa.accept[walk.stop_state], -1)
    nested = np.flatnonzero(labels >= 0)
    if not len(nested):  # most walks: no row ends a lexeme part-way
        return rows[walk.end_state >= 0], []
    found = labels[nested]
    ended = sorted((lex.terminals[label], nested[found == label]) for label in set(found.tolist()))
    return rows[walk.end_state >= 0], [(terminals, rows[m], walk.stop_pos[m]) for terminals, m in ended]

