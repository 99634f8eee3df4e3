"""`uniqueItems` enforced on any item schema: a constraint around the compiled one that reads the JSON
bytes as they come and vetoes the byte that completes an item equal to an earlier item of its array.

A regular language cannot say "distinct" (json_arrays.py enforces it in the grammar only over a few enum
values), so a small scanner follows the output beside the inner constraint: the container stack, each
member's and item's place in the schema (jsonschema/unique_walk.py says which arrays must hold distinct
items), and, per such array, the raw text of the item being read and of the items read so far. An item
completes at its closing quote, its closing bracket, or the byte after a number or literal; it is
compared as a JSON value (1 and 1.0 equal, objects whatever their key order, true not 1).

Masks: the inner mask, less the tokens the scanner refuses. Only tokens that may complete an item (a quote
inside a string; a closer, a blank or a later quote outside) are read through the scanner, and tokens
that would leave an item able to complete only as a repeat (an enum's last spellings) are refused too
(`_live`): no mask leads to a state with no way to finish. The state is (inner state, scanner state),
both hashable; the tokens a watched state refuses are kept by it.
"""
from __future__ import annotations

import json
import re
import weakref
from dataclasses import dataclass
from decimal import Decimal
from functools import cached_property, lru_cache
from typing import Hashable

import numpy as np

from .closing import CLOSE_ORDER, greedy_close
from .json_equality import json_key
from .jsonschema.unique_walk import TOP, UniqueWalk
from .masks.vocab import TokenVocab
from .matcher import Constraint

_BLANK = frozenset(b" \t\n\r")
_SCALAR_END = frozenset(b" \t\n\r,]}")
_STRING_STOP = re.compile(rb'["\\]')  # where a string's run of plain bytes stops
_SCALAR_STOP = re.compile(rb"[ \t\n\r,\]}]")  # where a number's or literal's does
LIVE_BUDGET = 256  # states the dead-end search visits before it assumes a way out
MAX_VETO_STATES = 65_536  # watched states whose refused tokens are kept (a few ids each); past it they start over
_OBJ, _ARR = 0, 1
_OUT, _SCALAR, _STR, _ESC = 0, 1, 2, 3  # lexical modes: between tokens, in a number/literal, in a string, after '\'

# frames: (_OBJ, loc, member loc, wants a key) | (_ARR, loc, index, unique, seen raw items, item text, item done)
Scan = tuple[tuple[tuple, ...], int, bytes | None]  # (frames, mode, the key being read or None)
State = tuple[Hashable, Scan]


@dataclass(eq=False)
class _VocabClasses:
    """Per vocabulary (built once): packed bits of the tokens that may complete an item, by mode."""
    in_string: np.ndarray  # holds a quote
    outside: np.ndarray  # holds a closer, a blank, or a quote after its first byte
    opens_two: np.ndarray  # holds '[' and later ',' (opens an array and starts its second item)
    opens_two_quoted: np.ndarray  # holds a quote, later '[' and later ',' (the same, from inside a string)
    single: np.ndarray  # [256] the token spelling each byte alone (-1: none)
    token_bytes: list[bytes]
    ids: np.ndarray

    @cached_property
    def by_bytes(self) -> dict[bytes, list[int]]:
        """Every token by its bytes (a few spell the same bytes)."""
        out: dict[bytes, list[int]] = {}
        for t in self.ids.tolist():
            out.setdefault(self.token_bytes[t], []).append(t)
        return out


_classes: weakref.WeakKeyDictionary[TokenVocab, _VocabClasses] = weakref.WeakKeyDictionary()


def vocab_classes(vocab: TokenVocab) -> _VocabClasses:
    """The vocabulary's token classes (built once per vocabulary, as its trie: not a schema's cost)."""
    hit = _classes.get(vocab)
    if hit is None:
        m, ids = vocab.matrix, vocab.ids
        valid = np.arange(m.shape[1])[None, :] < vocab.lengths[:, None]

        def bits(rows: np.ndarray) -> np.ndarray:
            mask = np.zeros(vocab.size, bool)
            mask[ids[rows]] = True
            return np.packbits(mask, bitorder="little")

        quote = (m == ord('"')) & valid
        closers = np.zeros(256, bool)
        closers[list(b",]} \t\n\r")] = True
        closer = closers[m] & valid
        later_quote = quote.copy()
        later_quote[:, 0] = False
        bracket = (m == ord("[")) & valid
        opening = np.cumsum(bracket, axis=1) > 0
        opening_quoted = np.cumsum(bracket & (np.cumsum(quote, axis=1) > 0), axis=1) > 0
        comma = (m == ord(",")) & valid
        single = np.full(256, -1, np.int64)
        ones = np.flatnonzero(vocab.lengths == 1)[::-1]  # the lowest id last: it is kept
        single[m[ones, 0]] = ids[ones]
        hit = _classes[vocab] = _VocabClasses(
            bits(quote.any(axis=1)), bits((closer | later_quote).any(axis=1)),
            bits((opening & comma).any(axis=1)), bits((opening_quoted & comma).any(axis=1)), single,
            vocab.token_bytes, ids)
        hit.by_bytes  # noqa: B018 - built now, with the rest
    return hit


@lru_cache(maxsize=65_536)
def canonical(text: bytes) -> Hashable:
    """An item's JSON value, hashable, equal exactly where JSON Schema calls two values equal."""
    try:
        return json_key(json.loads(text, parse_float=Decimal, parse_int=Decimal))
    except ValueError:
        return ("raw", text)  # not a value: equal to no other


@lru_cache(maxsize=4096)
def _canonical_set(seen: frozenset[bytes]) -> frozenset:
    return frozenset(canonical(t) for t in seen)


class UniqueItems:
    """`inner` with the arrays that `walk` says must hold distinct items held to it."""

    def __init__(self, inner: Constraint, walk: UniqueWalk, unenforced: tuple[str, ...]):
        self.inner, self.walk, self.vocab = inner, walk, inner.vocab
        self.unenforced = unenforced
        self._classes = vocab_classes(self.vocab)
        self._vetoes: dict[State, tuple[int, ...]] = {}  # per watched state: the tokens it refuses (few)
        # per inner state outside such arrays, and whether in a string: may a token open one and repeat
        self._opens: dict[tuple[Hashable, bool], bool] = {}
        self._live_memo: dict[State, bool] = {}
        self._initial: State = (inner.initial(), ((), _OUT, None))

    @property
    def outgrown(self) -> bool:
        return bool(getattr(self.inner, "outgrown", False))

    # ---- the scanner ----------------------------------------------------------------------------
    def _scan(self, scan: Scan, data: bytes) -> Scan | None:
        """The scanner after `data` (None: it completes a repeated item). The inner constraint has
        checked the bytes are JSON."""
        frames, mode, key = list(scan[0]), scan[1], scan[2]
        walk = self.walk
        i, n = 0, len(data)
        while i < n:
            if mode == _STR or mode == _SCALAR:
                # a run of a string's plain bytes (or a number's / literal's) changes nothing but the text read:
                # it joins the key being read and every open item's text at once
                stop = (_STRING_STOP if mode == _STR else _SCALAR_STOP).search(data, i)
                j = n if stop is None else stop.start()
                if j > i:
                    if key is not None:
                        key += data[i:j]
                    _join(frames, data[i:j], len(frames))
                    i = j
                    continue
            b = data[i]
            i += 1
            skip_top = False  # the byte is the top array's own (opens it, or separates its items)
            complete = False  # the byte completes the item of the array on top (after it is appended)
            if mode == _STR:
                if b == 0x5C:
                    mode = _ESC
                else:  # the closing quote (a run stops only there or at a backslash)
                    mode = _OUT
                    if key is not None:
                        top = frames[-1]
                        member = TOP if top[1] == TOP else walk.member(top[1], _key_text(key))
                        frames[-1] = (_OBJ, top[1], member, False)
                        key = None
                    else:
                        complete = True
            elif mode == _ESC:
                mode = _STR
                if key is not None:
                    key += b"\\" + bytes((b,))
            else:
                if mode == _SCALAR:  # its end (a run stops only there)
                    mode = _OUT
                    if frames and frames[-1][0] == _ARR and not frames[-1][6]:
                        if not self._complete(frames, len(frames) - 1):
                            return None
                if b == 0x22:
                    mode = _STR
                    if frames and frames[-1][0] == _OBJ and frames[-1][3]:
                        key = b""
                elif b == 0x7B or b == 0x5B:  # { [
                    loc = self._value_loc(frames)
                    if b == 0x7B:
                        frames.append((_OBJ, loc, TOP, True))
                    else:
                        unique = loc != TOP and walk.demand(loc)
                        frames.append((_ARR, loc, 0, unique, frozenset() if unique else None, b"", False))
                        skip_top = True
                elif b == 0x7D or b == 0x5D:  # } ]
                    frames.pop()
                    complete = True
                elif b == 0x2C:  # ,
                    top = frames[-1]
                    if top[0] == _OBJ:
                        frames[-1] = (_OBJ, top[1], TOP, True)
                    else:
                        frames[-1] = (_ARR, top[1], top[2] + 1, top[3], top[4], b"", False)
                        skip_top = True
                elif b not in _BLANK and b != 0x3A:  # a number or literal starts
                    mode = _SCALAR
            _join(frames, bytes((b,)), len(frames) - 1 if skip_top else len(frames))
            if complete and frames and frames[-1][0] == _ARR and not self._complete(frames, len(frames) - 1):
                return None
        return tuple(frames), mode, key

    def _value_loc(self, frames: list[tuple]) -> int:
        if not frames:
            return self.walk.root
        top = frames[-1]
        if top[0] == _OBJ:
            return top[2]
        return TOP if top[1] == TOP else self.walk.item(top[1], top[2])

    @staticmethod
    def _complete(frames: list[tuple], i: int) -> bool:
        """Marks the item of the array frames[i] read; False where it repeats an earlier one."""
        f = frames[i]
        if not f[3]:
            frames[i] = (*f[:6], True)
            return True
        text = f[5].strip(b" \t\n\r")
        if canonical(text) in _canonical_set(f[4]):
            return False
        frames[i] = (f[0], f[1], f[2], f[3], f[4] | {text}, f[5], True)
        return True

    # ---- dead ends ------------------------------------------------------------------------------
    @staticmethod
    def _open_item(scan: Scan) -> tuple[bytes, frozenset[bytes]] | None:
        """The text so far and the earlier items of the innermost array that must hold distinct items,
        where its item is being read and its text so far begins an earlier one's."""
        for f in reversed(scan[0]):
            if f[0] == _ARR and f[3]:
                if f[6] or not f[4]:
                    return None
                text = f[5].lstrip(b" \t\n\r")
                return (text, f[4]) if any(r.startswith(text) for r in f[4]) else None
        return None

    def _live(self, state: State) -> bool:
        """Whether the item being read (where it begins an earlier one) can still complete as a new
        value: a search over the next bytes, stopped by a byte leaving every earlier item's text or by
        the item's completion. Past LIVE_BUDGET states it assumes so (a dead end there is the cost)."""
        hit = self._live_memo.get(state)
        if hit is not None:
            return hit
        depth = len(state[1][0])
        seen, todo, budget, live = {state}, [state], LIVE_BUDGET, False
        while todo and not live:
            st = todo.pop()
            budget -= 1
            if budget <= 0:
                live = True
                break
            opened = self._open_item(st[1])
            if opened is None:  # read, a new value, or no longer the prefix of an earlier one
                live = True
                break
            text, earlier = opened
            follows = {r[len(text)] for r in earlier if len(r) > len(text) and r.startswith(text)}
            nexts = self._next_bytes(st[0])
            if any(b not in follows and b not in _SCALAR_END and b != 0x22 for b in nexts):
                live = True  # a byte leaves every earlier item's text (looked for before stepping any)
                break
            for b in nexts:
                nxt = self.advance_bytes(st, bytes((b,)))
                if nxt is None or nxt in seen:
                    continue
                if len(nxt[1][0]) < depth:  # the array closed: its items were distinct
                    live = True
                    break
                seen.add(nxt)
                todo.append(nxt)
        if len(self._live_memo) > 65_536:
            self._live_memo.clear()
        self._live_memo[state] = live
        return live

    def _next_bytes(self, inner_state: Hashable) -> list[int]:
        row = getattr(self.inner, "_row", None)
        if row is not None:
            targets = row(inner_state)[CLOSE_ORDER]
            return CLOSE_ORDER[targets >= 0].tolist()
        bits = self.inner.allowed_bits(inner_state)
        out = []
        for b in CLOSE_ORDER.tolist():
            t = int(self._classes.single[b])
            if t >= 0 and t >> 3 < len(bits):
                if bits[t >> 3] >> (t & 7) & 1:
                    out.append(b)
            elif self.inner.advance_bytes(inner_state, bytes((b,))) is not None:
                out.append(b)
        return out

    # ---- the Constraint protocol ----------------------------------------------------------------
    def initial(self) -> State:
        return self._initial

    def advance(self, state: State, token_id: int) -> State | None:
        inner = self.inner.advance(state[0], token_id)
        if inner is None:
            return None
        scan = self._scan(state[1], self.vocab.bytes_of(token_id))
        if scan is None:
            return None
        nxt = (inner, scan)
        if self._open_item(scan) is not None and not self._live(nxt):
            return None
        return nxt

    def advance_bytes(self, state: State, data: bytes) -> State | None:
        inner = self.inner.advance_bytes(state[0], data)
        if inner is None:
            return None
        scan = self._scan(state[1], data)
        return None if scan is None else (inner, scan)

    def can_end(self, state: State) -> bool:
        return self.inner.can_end(state[0])

    def allowed(self, state: State) -> np.ndarray:
        return np.unpackbits(self.allowed_bits(state), count=self.vocab.size, bitorder="little").view(bool)

    def allowed_bits(self, state: State) -> np.ndarray:
        bits = self.inner.allowed_bits(state[0])
        frames, mode = state[1][0], state[1][1]
        if any(f[0] == _ARR and f[3] for f in frames):
            cls = self._classes.in_string if mode in (_STR, _ESC) else self._classes.outside
        elif self.walk.root != TOP:
            # inside a string, a token opens an array only past a quote (`[:,` in a string is text)
            quoted = mode in (_STR, _ESC)
            cls = self._classes.opens_two_quoted if quoted else self._classes.opens_two
            opens = self._opens.get((state[0], quoted))
            if opens is None:
                if len(self._opens) >= MAX_VETO_STATES:
                    self._opens.clear()
                opens = self._opens[state[0], quoted] = bool((bits & cls[:len(bits)]).any())
            if not opens:
                return bits
        else:
            return bits
        vetoes = self._vetoes.get(state)
        if vetoes is None:
            if len(self._vetoes) >= MAX_VETO_STATES:
                self._vetoes.clear()
            vetoes = self._vetoes[state] = self._vetoed(state, bits, cls)
        if not vetoes:
            return bits
        out = bits.copy()
        for t in vetoes:
            out[t >> 3] &= ~(1 << (t & 7)) & 0xFF
        return out

    def _vetoed(self, state: State, bits: np.ndarray, cls: np.ndarray) -> tuple[int, ...]:
        """The tokens of `bits` the scanner refuses, among those that may complete an item or begin an
        earlier item's text."""
        n = len(bits)
        both = bits & cls[:n]
        check: set[int] = set()
        for i in np.flatnonzero(both).tolist():
            byte = int(both[i])
            check.update(8 * i + k for k in range(8) if byte >> k & 1)
        opened = self._open_item(state[1])
        if opened is not None:
            text, earlier = opened
            for r in earlier:
                if r.startswith(text):
                    rest = r[len(text):]
                    for k in range(1, min(len(rest), self.vocab.longest) + 1):
                        check.update(t for t in self._classes.by_bytes.get(rest[:k], ())
                                     if t >> 3 < n and bits[t >> 3] >> (t & 7) & 1)
        # as `advance` refuses them, the scanner first: every token here is in the inner mask (the inner state
        # reads it), and the inner state after it matters only to the dead-end search
        refused = []
        for t in sorted(check):
            scan = self._scan(state[1], self.vocab.bytes_of(t))
            if scan is None:
                refused.append(t)
            elif self._open_item(scan) is not None:
                inner = self.inner.advance(state[0], t)
                if inner is None or not self._live((inner, scan)):
                    refused.append(t)
        return tuple(refused)

    def forced_bytes(self, state: State, limit: int) -> bytes:
        forced = self.inner.forced_bytes(state[0], limit)
        scan: Scan | None = state[1]
        for i in range(len(forced)):
            scan = self._scan(scan, forced[i:i + 1])  # type: ignore[arg-type]
            if scan is None:
                return forced[:i]
        return forced

    def closing_bytes(self, state: State, limit: int, nonempty: bool = False) -> bytes | None:
        own = getattr(self.inner, "closing_bytes", None)
        if own is not None:
            data = own(state[0], limit, nonempty)
            if data is not None and self._scan(state[1], data) is not None:
                return data
        return None if nonempty else greedy_close(self, state, limit)


def _join(frames: list[tuple], text: bytes, upto: int) -> None:
    """`text` joins the text of every item being read among frames[:upto] (the top array's only till it is read)."""
    last = len(frames) - 1
    for i in range(upto):
        f = frames[i]
        if f[0] == _ARR and f[3] and (i < last or not f[6]):
            frames[i] = (*f[:5], f[5] + text, f[6])


def _key_text(raw: bytes) -> str:
    try:
        return json.loads(b'"' + raw + b'"')
    except ValueError:
        return raw.decode("utf-8", "replace")
