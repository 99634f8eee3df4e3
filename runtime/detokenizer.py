"""Incremental detokenization with stop strings.

Text is released only once it is final: never half a UTF-8 character, and never a tail that could
still turn out to be the start of a stop string.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Sequence

from .config import STOP_REGEX_HOLD_CHARS
from .tokenizer import Tokenizer

_CONTEXT_TOKENS = 5  # earlier tokens decoded alongside, so word-initial spaces come out right


@dataclass(slots=True)
class DetokenizeResult:
    delta: str  # newly released text
    stop: str | None  # the stop string that ended generation, if any


@dataclass
class IncrementalDetokenizer:
    tokenizer: Tokenizer
    stop: Sequence[str] = ()
    skip_special_tokens: bool = True
    trim_stop: bool = True
    context_ids: Sequence[int] = ()
    stop_regex: Sequence[str] = ()  # SGLang's stop_regex: the output ends where one of these first matches
    ids: list[int] = field(init=False)
    text: str = field(init=False, default="")  # all text decoded so far (stop string trimmed at the end)
    released: int = field(init=False, default=0)  # len(text) already handed out
    _prefix: int = field(init=False)
    _read: int = field(init=False)
    _before: str | None = field(init=False, default=None)  # decode of ids[_prefix:_read], once known
    _patterns: list[re.Pattern] = field(init=False)
    _regex_hold: int = field(init=False)  # chars a stop_regex match ending later may start before the end

    def __post_init__(self) -> None:
        self.ids = list(self.context_ids[-_CONTEXT_TOKENS:])
        self._prefix = 0
        self._read = len(self.ids)
        self._patterns = [re.compile(p) for p in self.stop_regex]
        # longest match, in chars; re._parser is private, so typeshed has no stub for it
        widths = [re._parser.parse(p).getwidth()[1] for p in self.stop_regex]  # type: ignore[attr-defined]
        self._regex_hold = min(max(widths, default=1) - 1, STOP_REGEX_HOLD_CHARS)

    def add(self, token_ids: Sequence[int], check_stop: bool = True) -> DetokenizeResult:
        ids = self.ids
        ids += token_ids
        before = self._before
        if before is None:
            before = self._before = self._decode(self._prefix, self._read)
        after = self._decode(self._prefix, len(ids))
        if len(after) > len(before) and not after.endswith("\ufffd"):
            start = len(self.text)
            new = after[len(before):]
            self.text += new
            self._prefix, self._read, self._before = self._read, len(ids), None
            if not self.stop and not self._patterns:  # nothing held back: all text so far is out once `new` is
                self.released = len(self.text)
                return DetokenizeResult(new, None)
            hit = self._find_stop(start) if check_stop else None
            if hit is not None:
                return self._finish_at(*hit)
        return DetokenizeResult(self._release(self._held_back()), None)

    def _decode(self, start: int, end: int) -> str:
        if end - start == 1:  # a window of one token: the steady state, one new token per step
            return self.tokenizer.decode_token(self.ids[start], self.skip_special_tokens)
        return self.tokenizer.decode(self.ids[start:end], self.skip_special_tokens)

    def flush(self) -> str:
        """Release everything (the request finished for a reason other than a stop string), including
        tokens held back because their text ended in U+FFFD: that may be the token's own text."""
        before = self._decode(self._prefix, self._read)
        self.text += self._decode(self._prefix, len(self.ids))[len(before):]
        self._prefix = self._read = len(self.ids)
        self._before = None
        return self._release(0)

    def _find_stop(self, new_from: int) -> tuple[int, int, str] | None:
        """(start, end, what matched: the stop string or stop_regex pattern) of the first stop that ends
        in the new text."""
        best: tuple[int, int, str] | None = None
        for s in self.stop:
            i = self.text.find(s, max(0, new_from - len(s) + 1))
            if i != -1 and (best is None or i < best[0]):
                best = (i, i + len(s), s)
        for pattern in self._patterns:
            m = next((m for m in pattern.finditer(self.text) if m.end() > new_from), None)
            if m is not None and (best is None or m.start() < best[0]):
                best = (m.start(), m.end(), pattern.pattern)
        return best

    def _finish_at(self, start: int, end: int, matched: str) -> DetokenizeResult:
        self.text = self.text[: start if self.trim_stop else end]
        return DetokenizeResult(self._release(0), matched)

    def _held_back(self) -> int:
        """Length of the longest tail of text that is a proper prefix of some stop string, or that a
        stop_regex match ending later could start in."""
        longest = min(self._regex_hold, len(self.text)) if self._patterns else 0
        for s in self.stop:
            for k in range(min(len(s) - 1, len(self.text)), longest, -1):
                if self.text.endswith(s[:k]):
                    longest = k
                    break
        return longest

    def _release(self, hold: int) -> str:
        end = max(self.released, len(self.text) - hold)
        delta = self.text[self.released:end]
        self.released = end
        return delta
