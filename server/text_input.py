"""Client text -> token ids. Text the tokenizer cannot take (a lone UTF-16 surrogate, which JSON's
\\ud800 escape can carry) is the client's mistake: a 400 naming the field, before the tokenizer sees it."""
from __future__ import annotations

from typing import Sequence

from ..runtime.tokenizer import Tokenizer
from .errors import APIError


def check_unicode(text: str, param: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as e:
        raise APIError(400, f"{param} is not valid Unicode: it has a lone surrogate U+{ord(text[e.start]):04X} at "
                            f"character {e.start}", param) from None


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str], param: str, batched: bool) -> list[list[int]]:
    """The token ids of each text ([] for an empty one). Slow on long texts: call it on a worker thread.
    `batched`: the client sent a list, so a bad text is named `param[i]`."""
    for i, text in enumerate(texts):
        check_unicode(text, f"{param}[{i}]" if batched else param)
    ids = iter(tokenizer.encode_batch([t for t in texts if t]))
    return [next(ids) if t else [] for t in texts]
