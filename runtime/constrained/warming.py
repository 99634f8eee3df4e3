"""Masks computed at compile, for the states a decode reaches first.

A mask costs a vocabulary walk the first time a state is reached (tens of microseconds, more where a lazily built
table or a lexer is built on the way), and a lookup after. The compile runs on the request's own thread, before its
prefill; a mask runs on the scheduler's, inside a decode step that the whole batch waits for. So a compile spends a
small budget (EngineConfig.constraint_precompute_ms) walking the states nearest its start, best first, as xgrammar
precomputes its states' masks at compile: a decode then finds most of its masks ready.

"Nearest" is in bytes from the start, after the members skipped: in a lazily built object (object_dispatch), a state
reached by writing a member ahead of declared members still missing (or a key's first bytes, where every key they
can still end is such a member's) comes after every state reached in declared order (models write members in the
schema's order, and every other order is a table of its own; xgrammar and llguidance allow only that one). Within
an order, a state only a rare byte leads to (a non-ASCII character's middle, an escape's: RARE_BYTES) comes after
every state reached without one. A constraint offers this through `warm_edges`; one without it (a peer's, a
wrapper's) is not warmed.
"""
from __future__ import annotations

import contextlib
import heapq
import itertools
import time
from typing import Hashable, Iterable, Protocol

import numpy as np

from ..config import WARM_FLOOR_S, WARM_SLOW_COMPILE_S
from . import deadline
from .regex.fsa import ConstraintTooLarge

# warming stops once a constraint that grows (a lazily built table's rows, a grammar's parser stacks) holds this
# share of its cache bound: each lazily built value copy numbers all its states (a bounded string's thousands), and
# 25 ms of other member orders numbered 65,868 rows in one of JSONSchemaBench's schemas (Snowplow sp_244), past
# the bound, so the cache would have compiled it afresh at every request
WARM_GROWTH_SHARE = 0.125
# the bytes a model's JSON seldom writes (a non-ASCII character's, an escape's): the states only they lead to (a
# character's middle, an escape's) warm after every state reached without them, however near the start. Warmed
# by distance alone, a string's first byte's ~10 such states (one per UTF-8 lead byte class, the escapes') came
# before its object's next member
RARE_BYTES = np.zeros(256, bool)
RARE_BYTES[0x80:] = True
RARE_BYTES[ord("\\")] = True


def byte_edges(row: np.ndarray) -> list[tuple[int, bool]]:
    """The states a byte row (256 targets, -1: dead) leads to, each with whether only rare bytes lead there."""
    live = row >= 0
    common = set(np.unique(row[live & ~RARE_BYTES]).tolist())
    return [(t, t not in common) for t in np.unique(row[live]).tolist()]


def warm_seconds(budget: float, compiled: float) -> float:
    """What a compile that took `compiled` seconds (to its first mask) spends warming: its `budget`, but no further
    than where the two together reach WARM_SLOW_COMPILE_S (or the budget, where that is larger), nor under
    WARM_FLOOR_S."""
    return min(budget, max(WARM_FLOOR_S, WARM_SLOW_COMPILE_S - compiled, budget - compiled))


class Warmable(Protocol):
    def initial(self) -> Hashable: ...
    def allowed_bits(self, state: Hashable) -> object: ...

    def warm_edges(self, state: Hashable) -> Iterable[tuple[Hashable, int, bool]]:
        """The states one byte on from `state` (its mask computed), each with the members it skips (0 but where
        the step writes a member ahead of declared ones still missing) and whether only RARE_BYTES lead there."""
        ...


def warm(constraint: object, seconds: float, max_states: int | None = None) -> int:
    """Computes the masks of `constraint`'s states nearest its start until `seconds` have passed or `max_states` are
    done; returns how many. The clock is read between states, and, in a constraint that says it may be stopped
    anywhere (`warm_interruptible`: a grammar, whose lexers are kept only once built whole), inside the automaton
    builds too, as a compile's deadline is (one lexer of a large schema took 250 ms). A lazily built table's pieces
    (a millisecond or two each) are not stopped half built. A constraint that grows stops at WARM_GROWTH_SHARE of
    its cache bound. A lexer or a lazily built piece too large ends the warming, not the compile: a decode may never
    reach it, and one that does is refused there as before."""
    if not hasattr(constraint, "warm_edges") or seconds <= 0:
        return 0
    warmable: Warmable = constraint  # type: ignore[assignment]  # it has warm_edges
    until = time.perf_counter() + seconds
    start = warmable.initial()
    order = itertools.count()  # ties by arrival
    # (skipped, rare bytes, bytes, order, state)
    queue: list[tuple[int, int, int, int, Hashable]] = [(0, 0, 0, next(order), start)]
    seen = {start}
    done = 0
    stops = deadline.limit(seconds) if getattr(constraint, "warm_interruptible", False) else contextlib.nullcontext()
    try:
        with stops:
            while queue and time.perf_counter() < until and (max_states is None or done < max_states) \
                    and getattr(constraint, "grown_share", 0.0) < WARM_GROWTH_SHARE:
                skipped, rares, depth, _, state = heapq.heappop(queue)
                warmable.allowed_bits(state)
                done += 1
                for nxt, extra, rare in warmable.warm_edges(state):
                    if nxt not in seen:
                        seen.add(nxt)
                        heapq.heappush(queue, (skipped + extra, rares + rare, depth + 1, next(order), nxt))
    except (ConstraintTooLarge, deadline.CompileDeadline):
        pass
    return done
