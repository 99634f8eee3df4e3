"""The vocabulary as byte strings, laid out for vectorised DFA walks."""
from __future__ import annotations

import threading
from dataclasses import dataclass, field
from functools import cached_property
from typing import Sequence

import numpy as np

from .native_trie import NativeTrie
from .vocab_trie import VocabTrie

_FIRST_SETS = 256  # first-byte sets kept (starting_with)
_lock = threading.Lock()


@dataclass(eq=False)
class TokenVocab:
    """Tokens a constraint may allow: every non-special token with at least one byte.

    Rows of `matrix` are those tokens' bytes, zero-padded; `ids[r]` is row r's token id.
    """

    size: int  # length of a mask (the model's vocabulary size)
    token_bytes: list[bytes]  # by token id
    end_ids: tuple[int, ...]  # tokens that end a constrained output (EOS)
    ids: np.ndarray  # [N] int64
    lengths: np.ndarray  # [N] int64
    matrix: np.ndarray  # [N, max_len] uint8
    special_ids: tuple[int, ...] = ()  # the special tokens with text (left out of the rows)
    _first_sets: dict[bytes, np.ndarray] = field(default_factory=dict, repr=False)  # starting_with's

    @classmethod
    def create(cls, token_bytes: Sequence[bytes], special_ids: frozenset[int] | set[int],
               end_ids: Sequence[int], size: int) -> "TokenVocab":
        keep = [i for i, b in enumerate(token_bytes[:size]) if b and i not in special_ids]
        lengths = np.array([len(token_bytes[i]) for i in keep], np.int64)
        matrix = np.zeros((len(keep), int(lengths.max())), np.uint8)
        for row, i in enumerate(keep):
            matrix[row, : lengths[row]] = np.frombuffer(token_bytes[i], np.uint8)
        return cls(size, list(token_bytes), tuple(i for i in end_ids if i < size),
                   np.array(keep, np.int64), lengths, matrix,
                   tuple(sorted(i for i in special_ids if i < min(size, len(token_bytes)) and token_bytes[i])))

    @classmethod
    def from_tokenizer(cls, tokenizer, size: int) -> "TokenVocab":  # noqa: ANN001 - runtime.tokenizer.Tokenizer
        return cls.create(tokenizer.token_bytes, tokenizer.special_token_ids, tokenizer.eos_token_ids, size)

    @cached_property
    def trie(self) -> VocabTrie:
        """The byte trie of the rows (built on first use, then shared by every constraint)."""
        return VocabTrie.create(self.matrix, self.lengths)

    @cached_property
    def native_trie(self) -> NativeTrie | None:
        """The trie as the native token walk reads it; None where that walk is not available."""
        return NativeTrie.create(self.trie, self.ids, self.matrix, self.size, self.starting_with)

    @cached_property
    def by_bytes(self) -> dict[bytes, int]:
        """The rows' tokens by their bytes (the lowest id where two spell the same)."""
        out: dict[bytes, int] = {}
        for i in self.ids.tolist():
            out.setdefault(self.token_bytes[i], i)
        return out

    @cached_property
    def whole_bits(self) -> np.ndarray:
        """Packed little-endian bits over the mask: tokens that end on a character boundary and not on a
        backslash (a constraint's close near max_tokens allows only these: closing.py)."""
        mask = np.array([bool(b) and not b.endswith(b"\\") and _ends_whole(b) for b in self.token_bytes[:self.size]]
                        + [False] * max(0, self.size - len(self.token_bytes)))
        return np.packbits(mask, bitorder="little")

    @property
    def longest(self) -> int:
        """The most bytes one token spells."""
        return int(self.matrix.shape[1])

    @property
    def first_bytes(self) -> np.ndarray:
        return self.matrix[:, 0]

    @cached_property
    def _by_first_byte(self) -> np.ndarray:
        """[256, size / 8] packed bits: row b holds the tokens whose first byte is b (built once, 1.5 MB)."""
        out = np.zeros((256, -(-self.size // 8)), np.uint8)
        np.bitwise_or.at(out, (self.first_bytes, self.ids >> 3), (1 << (self.ids & 7)).astype(np.uint8))
        return out

    @cached_property
    def _any_first(self) -> np.ndarray:
        return np.bitwise_or.reduce(self._by_first_byte, axis=0)

    def starting_with(self, first: np.ndarray) -> np.ndarray:
        """Packed bits of the tokens whose first byte is one of `first` (bool [256]); shared, read-only.
        Kept per byte set: a grammar's lexer states end their lexemes on a few sets."""
        key = np.packbits(first).tobytes()
        hit = self._first_sets.get(key)
        if hit is None:
            rows = self._by_first_byte
            if first.sum() > 128:  # most bytes (a string's characters): all tokens but those of the few others
                hit = self._any_first & ~np.bitwise_or.reduce(rows[~first], axis=0)
            else:
                hit = np.bitwise_or.reduce(rows[first], axis=0) if first.any() else np.zeros(rows.shape[1], np.uint8)
            hit.flags.writeable = False
            with _lock:
                if len(self._first_sets) >= _FIRST_SETS:
                    self._first_sets.pop(next(iter(self._first_sets)))
                self._first_sets[key] = hit
        return hit

    def bytes_of(self, token_id: int) -> bytes:
        return self.token_bytes[token_id] if token_id < len(self.token_bytes) else b""


def _ends_whole(data: bytes) -> bool:
    """Whether `data` does not stop inside a UTF-8 character (continuation bytes alone: assumed whole)."""
    for k in range(1, min(4, len(data)) + 1):
        b = data[-k]
        if b & 0xC0 != 0x80:  # ASCII or a lead byte
            width = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4
            return width <= k
    return True
