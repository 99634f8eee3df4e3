"""Token log-probabilities in the shapes the OpenAI APIs return (SGLang's are in runtime/meta_info.py)."""
from __future__ import annotations

import codecs
from typing import Any

from ..runtime.execution.sampler import TokenLogprob
from ..runtime.tokenizer import Tokenizer


def token_text(tokenizer: Tokenizer, token_id: int) -> str:
    """A token's text; a token that is only part of a UTF-8 character is spelled `bytes:\\xNN`
    (OpenAI's convention), so no information is lost to a replacement character."""
    raw = tokenizer.token_bytes[token_id]
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError:
        return "bytes:" + "".join(f"\\x{b:02x}" for b in raw)


# ---- OpenAI /v1/completions ---------------------------------------------------------------------
class TextOffsets:
    """Where each token starts in a choice's text, in characters: a token that completes a multi-byte
    character started by earlier tokens starts where that character does."""

    def __init__(self, tokenizer: Tokenizer):
        self.tokenizer = tokenizer
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self.chars = 0

    def advance(self, token_id: int) -> int:
        start = self.chars
        self.chars += len(self.decoder.decode(self.tokenizer.token_bytes[token_id]))
        return start


def completion_logprobs(tokenizer: Tokenizer, token_ids: list[int], logprobs: list[TokenLogprob | None],
                        offsets: TextOffsets) -> dict[str, Any]:
    """The legacy completions `logprobs` object. A None entry is a token with no logprob (an echoed
    prompt's first token)."""
    return {
        "tokens": [token_text(tokenizer, t) for t in token_ids],
        "token_logprobs": [None if lp is None else lp.logprob for lp in logprobs],
        "top_logprobs": [None if lp is None else {token_text(tokenizer, t): v for t, v in lp.top}
                         for lp in logprobs],
        "text_offset": [offsets.advance(t) for t in token_ids],
    }


# ---- OpenAI /v1/chat/completions ----------------------------------------------------------------
def chat_logprobs(tokenizer: Tokenizer, logprobs: list[TokenLogprob]) -> dict[str, Any]:
    def item(token_id: int, logprob: float) -> dict[str, Any]:
        return {"token": token_text(tokenizer, token_id), "logprob": logprob,
                "bytes": list(tokenizer.token_bytes[token_id])}

    return {"content": [item(lp.token_id, lp.logprob) | {"top_logprobs": [item(t, v) for t, v in lp.top]}
                        for lp in logprobs]}
