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


def check_unicode_tree(value: object, param: str) -> None:
    """`check_unicode` on every string (and key) of decoded JSON; the error names the first bad one's path."""
    if isinstance(value, str):
        check_unicode(value, param)
    elif isinstance(value, dict):
        for key, item in value.items():
            check_unicode(key, param)  # before the key becomes part of a name
            check_unicode_tree(item, f"{param}.{key}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_unicode_tree(item, f"{param}[{i}]")


def encode_texts(tokenizer: Tokenizer, texts: Sequence[str], param: str, batched: bool,
                 context_length: int) -> list[list[int]]:
    """The token ids of each text ([] for an empty one), each shorter than the context. Slow on long
    texts: call it on a worker thread. `batched`: the client sent a list, so a bad text is `param[i]`."""
    names = [f"{param}[{i}]" if batched else param for i in range(len(texts))]
    for text, name in zip(texts, names):
        check_unicode(text, name)
    encoded = iter(tokenizer.encode_batch([t for t in texts if t]))
    prompts = [next(encoded) if t else [] for t in texts]
    for ids, name in zip(prompts, names):
        if len(ids) >= context_length:  # refused here, so the engine never checks a huge prompt on the event loop
            raise APIError(400, f"{name} has {len(ids)} tokens; the context holds {context_length}, so a prompt "
                                f"may have at most {context_length - 1}", name)
    return prompts
