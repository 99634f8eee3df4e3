"""Closing a constrained output within max_tokens: the shortest completion of a constraint from a state.

A constrained output cut by max_tokens is not valid: an unterminated string, an open object, a tool call
the parser drops. A model that never ends a string (a small model repeating itself inside a JSON
argument) is always cut. So a request's matcher knows its token budget (matcher.Matcher): from the last
CLOSE_HORIZON tokens on, it asks for the shortest completion of the constraint from the current state,
spelled in the fewest tokens; when the tokens left only just suffice for it, it forces that completion
token by token, as a thinking budget forces `</think>`. The output then ends at max_tokens, valid, and
is reported as cut (finish_reason "length"): a string closed early, a required property given its
shortest value.

The shortest completion, in bytes:
- a DFA constraint (regex, regular JSON schema, structural tags): breadth-first over its states, exact
  (`dfa_close`); ties go to the byte first in CLOSE_ORDER;
- other constraints (the LALR path, a thinking block around an answer): their own `closing_bytes`
  where they compose it, else a greedy walk (`greedy_close`): forced bytes, else the first byte of
  CLOSE_ORDER that leads to a state not seen on the way. Short, not always the shortest.
"""
from __future__ import annotations

from typing import Callable, Hashable, Protocol, TypeVar

import numpy as np

from .masks.vocab import TokenVocab

# closers first, then the shortest values, then printable ASCII, then the rest (UTF-8 continuations last)
_FIRST = b'}]"0:,'
CLOSE_ORDER = np.array(list(_FIRST) + [b for b in range(32, 127) if b not in _FIRST]
                       + [b for b in range(256) if b < 32 or b >= 127], np.intp)
CLOSE_MAX_BYTES = 1024  # longest completion looked for (a longer one does not fit the horizon anyway)


S = TypeVar("S", bound=Hashable)


class Closable(Protocol[S]):
    """What the walk reads of a constraint (matcher.Constraint's members)."""

    vocab: TokenVocab

    def advance(self, state: S, token_id: int) -> S | None: ...
    def advance_bytes(self, state: S, data: bytes) -> S | None: ...
    def can_end(self, state: S) -> bool: ...
    def forced_bytes(self, state: S, limit: int) -> bytes: ...


def shortest_close(constraint: Closable[S], state: S, limit: int = CLOSE_MAX_BYTES,
                   nonempty: bool = False) -> bytes | None:
    """The bytes that complete the output from `state` (b"" where it may end; `nonempty`: at least one
    byte, the shortest continuation of an output that may end), or None if none was found within `limit`
    bytes (a nonempty one: or not looked for, off the DFA path)."""
    own: Callable[[S, int, bool], bytes | None] | None = getattr(constraint, "closing_bytes", None)
    if own is not None:
        return own(state, limit, nonempty)
    return None if nonempty else greedy_close(constraint, state, limit)


def close_tokens(constraint: Closable[S], state: S, limit: int = CLOSE_MAX_BYTES,
                 nonempty: bool = False) -> tuple[int, ...] | None:
    """The shortest completion from `state` as the fewest tokens that spell it, each checked against the
    constraint (None: no completion found, or the tokens do not follow the constraint)."""
    data = shortest_close(constraint, state, limit, nonempty)
    if data is None:
        return None
    tokens = fewest_tokens(data, constraint.vocab)
    if tokens is None:
        return None
    for t in tokens:
        nxt = constraint.advance(state, t)
        if nxt is None:
            return None
        state = nxt
    return tokens if constraint.can_end(state) else None


def fewest_tokens(data: bytes, vocab: TokenVocab) -> tuple[int, ...] | None:
    """`data` spelled in the fewest ordinary tokens (special ones aside), or None if no split spells it."""
    by_bytes, longest = vocab.by_bytes, vocab.longest
    n = len(data)
    best: list[tuple[int, int] | None] = [None] * (n + 1)  # position -> (tokens to reach it, last token)
    best[0] = (0, -1)
    for i in range(n):
        here = best[i]
        if here is None:
            continue
        for j in range(i + 1, min(n, i + longest) + 1):
            t = by_bytes.get(data[i:j])
            if t is not None and (best[j] is None or best[j][0] > here[0] + 1):  # type: ignore[index]
                best[j] = (here[0] + 1, t)
    if best[n] is None:
        return None
    out, j = [], n
    while j > 0:
        t = best[j][1]  # type: ignore[index]
        out.append(t)
        j -= len(vocab.token_bytes[t])
    return tuple(reversed(out))


def dfa_close(start: int, row: Callable[[int], np.ndarray], accepting: Callable[[int], bool],
              limit: int, nonempty: bool = False) -> bytes | None:
    """Breadth-first from `start` to the nearest accepting state (`nonempty`: at least one byte away);
    `row(s)` is the [256] next states of s."""
    if accepting(start) and not nonempty:
        return b""
    parent: dict[int, tuple[int, int]] = {} if nonempty else {start: (_ROOT, -1)}
    frontier = [start]
    for depth in range(limit):
        reached = []
        for s in frontier:
            targets = row(s)[CLOSE_ORDER]
            _, first = np.unique(targets, return_index=True)
            for i in np.sort(first).tolist():
                t = int(targets[i])
                if t < 0 or t in parent:
                    continue
                parent[t] = (_ROOT if nonempty and depth == 0 else s, int(CLOSE_ORDER[i]))
                if accepting(t):
                    return _path(parent, t)
                reached.append(t)
        if not reached:
            return None
        frontier = reached
    return None


_ROOT = -1  # the parent of the walk's start


def _path(parent: dict[int, tuple[int, int]], end: int) -> bytes:
    out = bytearray()
    while end != _ROOT:
        end, b = parent[end]
        if b >= 0:
            out.append(b)
    return bytes(reversed(out))


def greedy_close(constraint: Closable[S], state: S, limit: int) -> bytes | None:
    """A short completion: forced bytes, else the first byte of CLOSE_ORDER leading to an unseen state."""
    out = bytearray()
    seen = {state}
    while not constraint.can_end(state):
        if len(out) >= limit:
            return None
        forced = constraint.forced_bytes(state, limit - len(out))
        step = forced if forced else None
        nxt = constraint.advance_bytes(state, forced) if forced else None
        if step is None:
            for b in CLOSE_ORDER.tolist():
                nxt = constraint.advance_bytes(state, bytes([b]))
                if nxt is not None and nxt not in seen:
                    step = bytes([b])
                    break
        if step is None or nxt is None:
            return None
        out += step
        state = nxt
        seen.add(state)
    return bytes(out)
