"""Compiled constraints (shared, immutable) and the per-request `Matcher` that walks one of them.

A constraint is an automaton over bytes whose states are hashable values. It answers, per state:
which vocabulary tokens may come next (`allowed`), whether the output may end here (`can_end`),
and which bytes are forced (`forced_bytes`, for jump-forward). EOS is allowed exactly where the
output may end.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Callable, Generic, Hashable, Protocol, TypeVar

import numpy as np

from ..config import CLOSE_HORIZON, CLOSE_SLACK, JUMP_FORWARD_MAX_BYTES, MASK_CACHE_SIZE
from .closing import close_tokens, dfa_close
from .masks.token_index import TokenIndex
from .masks.vocab import TokenVocab
from .regex.automaton import Dfa
from .warming import byte_edges

_NO_BITS = np.zeros(0, np.uint8)
_WORDS = np.dtype("<i4")  # a bitmask row's words (a dtype object: a view by name parses it every time)
WORD_ROWS_KEPT = 512  # EOS rows (WordRows) kept: a schema's states that may end are few
S = TypeVar("S", bound=Hashable)  # a constraint's state: each kind of constraint has its own


class Constraint(Protocol[S]):
    vocab: TokenVocab

    def initial(self) -> S: ...
    def advance(self, state: S, token_id: int) -> S | None: ...
    def advance_bytes(self, state: S, data: bytes) -> S | None: ...
    def allowed(self, state: S) -> np.ndarray: ...  # fresh bool [vocab.size], EOS excluded
    def allowed_bits(self, state: S) -> np.ndarray: ...  # the same as shared little-endian bits (uint8)
    def can_end(self, state: S) -> bool: ...
    def forced_bytes(self, state: S, limit: int) -> bytes: ...


class MaskCache:
    """An LRU of token masks keyed by automaton state, stored as bitsets (V/8 bytes each).

    `compute` returns a mask as bool [V] or already packed (uint8 little-endian bits, kept as is)."""

    def __init__(self, size: int = MASK_CACHE_SIZE):
        self.size = size
        self._items: OrderedDict[Hashable, tuple[np.ndarray, int]] = OrderedDict()

    def get(self, key: Hashable, compute: Callable[[], np.ndarray], size: int = 0) -> np.ndarray:
        """The mask as a fresh bool [V] (`size`: V, where `compute` returns packed bits)."""
        hit = self._items.get(key)
        if hit is not None:
            self._items.move_to_end(key)
        else:
            mask = compute()
            hit = self._put(key, mask, size)
            if mask.dtype == bool:
                return mask
        return np.unpackbits(hit[0], count=hit[1], bitorder="little").view(bool)

    def get_bits(self, key: Hashable, compute: Callable[[], np.ndarray], size: int = 0) -> np.ndarray:
        """`get` as packed little-endian bits (shared: do not modify)."""
        hit = self._items.get(key)
        if hit is None:
            hit = self._put(key, compute(), size)
        else:
            self._items.move_to_end(key)
        return hit[0]

    def _put(self, key: Hashable, mask: np.ndarray, size: int = 0) -> tuple[np.ndarray, int]:
        if mask.dtype == bool:
            entry = (np.packbits(mask, bitorder="little"), len(mask))
        else:
            entry = (mask, size or 8 * len(mask))
        entry[0].flags.writeable = False  # shared: callers' rows (`WordRows`) rely on it
        self._items[key] = entry
        if len(self._items) > self.size:
            self._items.popitem(last=False)
        return entry


class WordRows:
    """Bitmask rows (`Matcher.mask_words`) of read-only stored bits, shared: the bits themselves where they fill
    the row and no EOS is added (most masks), else a row kept per (bits, EOS ids), the bits held so that their
    identity stays theirs. At most `size` kept rows (V/8 bytes each), the oldest dropped."""

    def __init__(self, size: int = WORD_ROWS_KEPT):
        self.size = size
        self._rows: dict[tuple[int, tuple[int, ...]], tuple[np.ndarray, np.ndarray]] = {}

    def row(self, bits: np.ndarray, ends: tuple[int, ...], size: int) -> np.ndarray:
        """The row of `bits` (read-only, never changed) with the tokens `ends` allowed, `size` bytes long."""
        if not ends and len(bits) == size:
            return bits.view(_WORDS)
        key = (id(bits), ends)
        hit = self._rows.get(key)
        if hit is None:
            words = row_bytes(bits, ends, size)
            words.flags.writeable = False
            if len(self._rows) >= self.size:
                self._rows.pop(next(iter(self._rows)), None)
            hit = self._rows[key] = (bits, words.view(_WORDS))
        return hit[1]


WORD_ROWS = WordRows()


def row_bytes(bits: np.ndarray, ends: tuple[int, ...], size: int, within: np.ndarray | None = None) -> np.ndarray:
    """A fresh bitmask row's bytes (`size` of them): `bits`, ANDed with `within` where given, and the tokens `ends`."""
    words = np.zeros(size, np.uint8)
    words[:len(bits)] = bits
    if within is not None:
        words[:len(within)] &= within
    for t in ends:
        words[t >> 3] |= 1 << (t & 7)
    return words


class RegexConstraint:
    """A regex (or a regular JSON schema) as one DFA and its token index."""

    unenforced: tuple[str, ...] = ()  # a JSON schema's relaxed keywords (compiler.unenforced)

    def __init__(self, dfa: Dfa, vocab: TokenVocab):
        self.dfa, self.vocab = dfa, vocab
        self.index = TokenIndex(dfa, vocab)

    def initial(self) -> int:
        return self.dfa.start

    def advance(self, state: int, token_id: int) -> int | None:
        if not self.index.allows(state, token_id):
            return None
        return self.dfa.walk(state, self.vocab.bytes_of(token_id))

    def advance_bytes(self, state: int, data: bytes) -> int | None:
        nxt = self.dfa.walk(state, data)
        return None if nxt < 0 else nxt

    def allowed(self, state: int) -> np.ndarray:
        return self.index.mask(state)

    def allowed_bits(self, state: int) -> np.ndarray:
        return self.index.packed(state)

    def can_end(self, state: int) -> bool:
        return bool(self.dfa.accept[state] >= 0)

    def closing_bytes(self, state: int, limit: int, nonempty: bool = False) -> bytes | None:
        """The shortest completion from `state` (closing.py)."""
        return dfa_close(state, self._row, self.can_end, limit, nonempty)

    def _row(self, state: int) -> np.ndarray:
        return self.dfa.row(state)

    def warm_edges(self, state: int) -> list[tuple[int, int, bool]]:
        """The states one byte on from `state`, none skipping a member, and whether only rare bytes reach each
        (warming.py's)."""
        return [(t, 0, rare) for t, rare in byte_edges(self._row(state))]

    def forced_bytes(self, state: int, limit: int = JUMP_FORWARD_MAX_BYTES) -> bytes:
        out = bytearray()
        while len(out) < limit and (b := self.index.forced_byte(state)) >= 0:
            out.append(b)
            state = self.dfa.step(state, b)
        return bytes(out)


class Matcher(Generic[S]):
    """One request's position in a constraint (a state per consumed token).

    `budget` (the request's max_new_tokens; None: none): the output is closed within it (closing.py).
    From the last CLOSE_HORIZON tokens on, a state whose shortest completion takes the tokens left forces
    that completion: the mask at each of its (state, tokens produced) is its next token, and the output
    ends where it ends (`closed`). Where the completion takes CLOSE_SLACK or fewer tokens less than are
    left, tokens that stop inside a UTF-8 character or on a backslash are masked out: the rest of the
    character (or the escape) would lengthen the close past the tokens left in one step."""

    def __init__(self, constraint: Constraint[S], end_ids: tuple[int, ...], budget: int | None = None):
        self.constraint = constraint
        self.end_ids = end_ids
        self.budget = budget
        self.states: list[S] = [constraint.initial()]
        self._complete: dict[Hashable, bool] = {}  # is_complete per state: it needs the whole mask
        self._closes: dict[Hashable, tuple[int, ...] | None] = {}  # per state: its completion's tokens
        self._forced: dict[tuple[Hashable, int], int] = {}  # (state, tokens produced) -> the closing token
        self._closed: set[tuple[Hashable, int]] = set()  # where a close ends
        self._continues: dict[Hashable, tuple[int, ...] | None] = {}  # per state that may end: its shortest continuation

    @property
    def state(self) -> S:
        return self.states[-1]

    def mask_words(self, state: S, produced: int | None = None) -> np.ndarray:
        """Which tokens may come next (EOS only where the output may end), as one row of the step's
        bitmask: int32 words, bit i of word w allowing token 32w + i; not to be modified (shared and
        read-only where the stored bits are: `WordRows`). Built from the stored bits (little-endian bytes are those words' bytes),
        never unpacked. `produced`: output tokens before this one (the budget's close applies only where
        it is given)."""
        closing, near = self.closing_token(state, produced) if produced is not None else (None, False)
        size = -(-self.constraint.vocab.size // 32) * 4
        if closing is not None:
            return row_bytes(_NO_BITS, (closing,), size).view(_WORDS)
        bits = self.constraint.allowed_bits(state)
        ends = self.end_ids if self.end_ids and self.constraint.can_end(state) else ()
        if not near and not bits.flags.writeable:
            return WORD_ROWS.row(bits, ends, size)
        # near the close, a token that stops inside a character or an escape would lengthen it past the budget
        return row_bytes(bits, ends, size, self.constraint.vocab.whole_bits if near else None).view(_WORDS)

    def closing_token(self, state: S, produced: int) -> tuple[int | None, bool]:
        """The token the budget's close forces at `state` after `produced` output tokens, if any, and
        whether the close nears (it takes the tokens left but CLOSE_SLACK or fewer)."""
        if self.budget is None:
            return None, False
        hit = self._forced.get((state, produced))
        left = self.budget - produced
        if hit is not None or left <= 0 or left > CLOSE_HORIZON or self.constraint.can_end(state):
            return hit, False
        if state not in self._closes:
            self._closes[state] = close_tokens(self.constraint, state)
        close = self._closes[state]
        if close is None or len(close) > left:  # too late: the output is cut
            return None, False
        if len(close) < left:
            return None, len(close) >= left - CLOSE_SLACK
        for i, t in enumerate(close):
            self._forced[(state, produced + i)] = t
            state = self.constraint.advance(state, t)  # type: ignore[assignment]  # close_tokens checked them
        self._closed.add((state, produced + len(close)))
        return close[0], False

    def closed(self, state: S, produced: int) -> bool:
        """Whether the budget's close ended the output at `state` after `produced` tokens (it was cut)."""
        return (state, produced) in self._closed

    def no_room(self, state: S, produced: int) -> bool:
        """Whether the output may end at `state` after `produced` tokens, but no continuation fits in the
        tokens left (a parallel call list: another call): a token other than EOS sampled there is a cut,
        and the output ends before it, valid."""
        left = self.budget - produced if self.budget is not None else 0
        if left <= 0 or left > CLOSE_HORIZON or not self.constraint.can_end(state):
            return False
        if state not in self._continues:
            self._continues[state] = close_tokens(self.constraint, state, nonempty=True)
        more = self._continues[state]
        return more is not None and len(more) > left

    def is_complete(self, state: S | None = None) -> bool:
        """The output may end here and no token but EOS may follow."""
        state = self.state if state is None else state
        done = self._complete.get(state)
        if done is None:
            done = self._complete[state] = bool(
                self.constraint.can_end(state) and not self.constraint.allowed_bits(state).any())
        return done

    def lookahead(self, tokens: list[int]) -> list[S]:
        """The states after each prefix of `tokens` (len(tokens) + 1 of them), without consuming any;
        the tokens must follow the constraint (a jump-forward draft does)."""
        states = [self.state]
        for t in tokens:
            nxt = self.constraint.advance(states[-1], t)
            assert nxt is not None, "a drafted token follows the constraint"
            states.append(nxt)
        return states

    def advance(self, token_id: int) -> bool:
        """Consumes one token; False (state unchanged) if the constraint does not allow it."""
        nxt: S | None
        if token_id in self.end_ids:
            nxt = self.state if self.constraint.can_end(self.state) else None
        else:
            nxt = self.constraint.advance(self.state, token_id)
        if nxt is None:
            return False
        self.states.append(nxt)
        return True

    def forced_bytes(self) -> bytes:
        """The unique continuation, if the constraint admits exactly one for a while ('' if none)."""
        return self.constraint.forced_bytes(self.state, JUMP_FORWARD_MAX_BYTES)
