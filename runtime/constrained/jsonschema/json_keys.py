"""Undeclared keys of an object that says nothing of them: any raw-character key but the declared names.

The general way (automaton.difference of `"` STRING_CHARS* `"` and the quoted names) determinizes the
names, builds the product and minimizes it: ~1 ms per object, thousands of objects in a large schema.
Here the minimal DFA comes straight from the names' trie: from a trie node, the keys that follow are
every string but the names' suffixes below it, so two nodes are one state exactly where those
suffixes are equal (hashed bottom-up, as a DAWG is), and a node with none below it is the state that
reads any key to its end. Same language, same alphabet as the difference.
"""
from __future__ import annotations

import numpy as np

from ..regex import regex_ast as ra
from ..regex.alphabet import CharDfa, alphabet_of
from ..regex.automaton import char_sets
from ..regex.dfa_cache import cached
from .json_scalars import STRING_CHARS, quoted

_QUOTE = ord('"')


def raw_keys_except(names: list[str]) -> CharDfa:
    """`"` STRING_CHARS* `"` but none of the quoted `names` (each as written: a name holding a character
    outside STRING_CHARS is no such key anyway). Built once per list of names (dfa_cache)."""
    return cached(("raw_keys_except", tuple(names)), lambda: _build(names))


def _build(names: list[str]) -> CharDfa:
    literals = [ra.literal(n) for n in names]
    # the alphabet the difference would have: the quote, STRING_CHARS and every character of the names
    alphabet = alphabet_of(char_sets([quoted(ra.repeat(ra.Chars(STRING_CHARS), 0, None)), quoted(ra.alt(*literals))]))
    string_cols = alphabet.members[STRING_CHARS]
    quote = alphabet.members[((_QUOTE, _QUOTE),)][0]
    in_string = set(string_cols)
    col_of = {ranges[0][0]: k for k, ranges in enumerate(alphabet.classes)  # a name's character in STRING_CHARS
              if len(ranges) == 1 and ranges[0][0] == ranges[0][1] and k in in_string}
    # the trie: per node, whether a name ends there, and its children by column
    ends: list[bool] = [False]
    children: list[dict[int, int]] = [{}]
    for name in names:
        node = 0
        for ch in name:
            col = col_of.get(ord(ch))
            if col is None:  # outside STRING_CHARS: no key spells this name
                break
            nxt = children[node].get(col)
            if nxt is None:
                nxt = children[node][col] = len(ends)
                ends.append(False)
                children.append({})
            node = nxt
        else:
            ends[node] = True
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
