"""Undeclared keys of an object: any key but the declared names, from the names' trie.

`raw_keys_except`, where the object says nothing of undeclared keys: raw-character keys only.

The general way (automaton.difference of `"` STRING_CHARS* `"` and the quoted names) determinizes the
names, builds the product and minimizes it: ~1 ms per object, thousands of objects in a large schema.
Here the minimal DFA comes straight from the names' trie: from a trie node, the keys that follow are
every string but the names' suffixes below it, so two nodes are one state exactly where those
suffixes are equal (hashed bottom-up, as a DAWG is), and a node with none below it is the state that
reads any key to its end. Same language, same alphabet as the difference.

`keys_except`, where the object allows undeclared keys: any JSON string, escapes too, but none that decodes to a
name (the difference of `"` STRING_CHAR* `"` and the names' `spellings`: ~50 ms an object with a few dozen names,
most of it the spellings' Thompson automaton). Its states are the trie's nodes at a character's start, after a
backslash, and after each prefix of a `\\u` escape's hex digits that some child's code point starts with (other
escapes and characters lead off the trie, to the state that reads any key), minimized as the difference is.
"""
from __future__ import annotations

import bisect
import functools
from typing import Hashable, TypeVar

import numpy as np

from ..regex import regex_ast as ra
from ..regex.alphabet import CharDfa, alphabet_of
from ..regex.automaton import char_sets
from ..regex.dfa_cache import cached
from ..regex.fsa import minimize, trim
from .json_scalars import STRING_CHARS, quoted, spellings, string_body

_QUOTE = ord('"')
K = TypeVar("K", bound=Hashable)


def raw_keys_except(names: list[str]) -> CharDfa:
    """`"` STRING_CHARS* `"` but none of the quoted `names` (each as written: a name holding a character
    outside STRING_CHARS is no such key anyway). Built once per list of names (dfa_cache)."""
    return cached(("raw_keys_except", tuple(names)), lambda: _build(names))


def _trie(words: list[tuple[list[K], bool]]) -> tuple[list[bool], list[dict[K, int]]]:
    """The trie of `words` (each its keys and whether it ends where they do: else its nodes are made, no end marked):
    per node, whether a word ends there, and its children by key; node 0 is the root, children after parents."""
    ends: list[bool] = [False]
    children: list[dict[K, int]] = [{}]
    for keys, whole in words:
        node = 0
        for key in keys:
            nxt = children[node].get(key)
            if nxt is None:
                nxt = children[node][key] = len(ends)
                ends.append(False)
                children.append({})
            node = nxt
        ends[node] = ends[node] or whole
    return ends, children


def _build(names: list[str]) -> CharDfa:
    literals = [ra.literal(n) for n in names]
    # the alphabet the difference would have: the quote, STRING_CHARS and every character of the names
    alphabet = alphabet_of(char_sets([quoted(ra.repeat(ra.Chars(STRING_CHARS), 0, None)), quoted(ra.alt(*literals))]))
    string_cols = alphabet.members[STRING_CHARS]
    quote = alphabet.members[((_QUOTE, _QUOTE),)][0]
    in_string = set(string_cols)
    col_of = {ranges[0][0]: k for k, ranges in enumerate(alphabet.classes)  # a name's character in STRING_CHARS
              if len(ranges) == 1 and ranges[0][0] == ranges[0][1] and k in in_string}
    # the trie: per node, whether a name ends there, and its children by column; a name holding a character outside
    # STRING_CHARS is cut short there: no key spells it
    words = []
    for name in names:
        cols = [col_of.get(ord(ch)) for ch in name]
        whole = None not in cols
        words.append((cols[:cols.index(None)] if not whole else cols, whole))
    ends, children = _trie(words)
    # each node's class: equal classes <=> equal sets of name suffixes below (children numbered after parents)
    free = (False, ())  # no name below: any key goes on to the end
    sigs: dict[tuple, int] = {free: 0}
    cls = [0] * len(ends)
    for node in range(len(ends) - 1, -1, -1):
        # a child of the free class is no child (a name cut short by a character outside STRING_CHARS)
        sig = (ends[node], tuple(sorted((c, cls[t]) for c, t in children[node].items() if cls[t])))
        cls[node] = sigs.setdefault(sig, len(sigs))
    by_class = {c: sig for sig, c in sigs.items()}
    # states: the start (before the opening quote), the classes breadth first from the root's, the end
    number = {cls[0]: 1}
    queue = [cls[0]]
    for c in queue:
        for nxt in (0, *(t for _, t in by_class[c][1])):
            if nxt not in number:
                number[nxt] = len(number) + 1
                queue.append(nxt)
    end = len(number) + 1
    trans = np.full((end + 1, len(alphabet.classes)), -1, np.int64)
    trans[0, quote] = number[cls[0]]
    trans[np.ix_(list(number.values()), list(string_cols))] = number[0]  # any other character: free
    for c, s in number.items():
        is_name, kids = by_class[c]
        for col, t in kids:
            trans[s, col] = number[t]
        if not is_name:
            trans[s, quote] = end
    accept = np.full(end + 1, -1, np.int64)
    accept[end] = 0
    return CharDfa(trans, accept, alphabet)


_SHORT = {"\"": "\"", "\\": "\\", "/": "/", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t"}  # \x -> its character
_HEX_DIGITS = "0123456789abcdefABCDEF"
_OFF = -1  # the trie node of a key that left every name: it reads any key to its end


def keys_except(names: list[str]) -> CharDfa:
    """`"` STRING_CHAR* `"` (any JSON string, escaped characters too) but none that decodes to one of `names`: the
    language of `difference(quoted(string_body()), quoted(alt(spellings(n) ...)))`, on its alphabet, minimal.
    Built once per list of names (dfa_cache)."""
    return cached(("keys_except", tuple(names)), lambda: _build_escaped(names))


@functools.cache
def _string_sets() -> tuple[ra.Ranges, ...]:
    return tuple(char_sets([quoted(string_body())]))


@functools.lru_cache(maxsize=4096)
def _spelled(ch: str) -> tuple[ra.Ranges, ...]:
    return tuple(char_sets([spellings(ch)]))


def _build_escaped(names: list[str]) -> CharDfa:
    # the difference's alphabet: the sets any key reads, and those each of the names' characters is spelled with
    alphabet = alphabet_of([*_string_sets(), *(one for ch in dict.fromkeys("".join(names)) for one in _spelled(ch))])
    spans = sorted((lo, hi, k) for k, ranges in enumerate(alphabet.classes) for lo, hi in ranges)
    los = [lo for lo, _, _ in spans]

    def column(ch: str) -> int:  # the class holding `ch`; -1: none (no key reads it there)
        at = bisect.bisect_right(los, ord(ch)) - 1
        return spans[at][2] if at >= 0 and ord(ch) <= spans[at][1] else -1

    raw = np.full(len(alphabet.classes), False)
    raw[list(alphabet.members[STRING_CHARS])] = True  # the classes read raw inside a key
    ends, children = _trie([(list(name), True) for name in names])  # the names' trie over decoded characters

    def child(node: int, ch: str) -> int:
        return _OFF if node == _OFF else children[node].get(ch, _OFF)

    def hex_children(node: int) -> list[tuple[str, int]]:  # (4 hex digits, child) of each escapable child
        return [(f"{ord(ch):04x}", nxt) for ch, nxt in children[node].items() if ord(ch) <= 0xFFFF]

    width = len(alphabet.classes)
    quote, backslash, letter_u = column('"'), column("\\"), column("u")
    short = [(column(letter), ch) for letter, ch in _SHORT.items()]
    hex_columns = np.array(sorted({column(d) for d in _HEX_DIGITS}))
    low_columns = np.array(sorted({column(d) for d in "01234567"}))  # after a first `d`: no surrogate
    d_columns = np.array(sorted({column(d) for d in "dD"}))
    ids: dict[tuple, int] = {("start",): 0, ("end",): 1}
    queue: list[tuple] = [("start",), ("end",)]
    rows: list[np.ndarray] = []

    def state(key: tuple) -> int:
        if key not in ids:
            ids[key] = len(queue)
            queue.append(key)
        return ids[key]

    while len(rows) < len(queue):
        key = queue[len(rows)]
        row = np.full(width, -1, np.int64)
        if key[0] == "start":
            row[quote] = state(("at", 0))
        elif key[0] == "end":  # after the closing quote: nothing more
            pass
        elif key[0] == "at":  # a character's start
            node = key[1]
            row[raw] = state(("at", _OFF))
            if node != _OFF:
                for ch, nxt in children[node].items():
                    k = column(ch)
                    if k >= 0 and raw[k]:  # a raw character of STRING_CHARS is a class of its own (a name's literal)
                        row[k] = state(("at", nxt))
            if node == _OFF or not ends[node]:
                row[quote] = 1
            row[backslash] = state(("esc", node))
        elif key[0] == "esc":  # after a backslash
            node = key[1]
            for k, ch in short:
                row[k] = state(("at", child(node, ch)))
            row[letter_u] = state(("u", node, ""))
        else:  # after \\u and `prefix`, lowercase hex: off the trie, only the count of digits and a first `d` matter
            _, node, prefix = key
            n = len(prefix)
            row[low_columns if prefix == "d" else hex_columns] = state(("at", _OFF) if n == 3 else ("u", _OFF, "x" * (n + 1)))
            if n == 0:
                row[d_columns] = state(("u", _OFF, "d"))
            if node != _OFF:
                for digits, nxt in hex_children(node):
                    if not digits.startswith(prefix) or (prefix == "d" and digits[1] not in "01234567"):
                        continue
                    digit = digits[n]
                    target = ("at", nxt) if n == 3 else ("u", node, prefix + digit)
                    for k in {column(digit), column(digit.upper())}:
                        row[k] = state(target)
        rows.append(row)
    accept = np.full(len(rows), -1, np.int64)
    accept[1] = 0
    trans, accept = minimize(*trim(np.stack(rows), accept))
    return CharDfa(trans, accept, alphabet)
