"""SGLang's `meta_info` of a completion: one builder for the server's /generate and the language's gen.

A token's text in the logprob lists is the tokenizer's decoding of that token alone, special tokens
included, as SGLang's `batch_decode` of the ids gives it: a token that is only part of a UTF-8
character reads as U+FFFD. (The OpenAI routes spell such a token `bytes:\\xNN` instead.)
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, Sequence

if TYPE_CHECKING:
    from .execution.sampler import TokenLogprob
    from .tokenizer import Tokenizer


class RequestStatus(Protocol):
    """What meta_info reads of a request: a CompletionMeta, or the StreamChunk that finished it."""

    # read-only (properties), so that a status whose field is narrower (CompletionMeta's finish_reason is
    # always a str) still conforms
    @property
    def rid(self) -> str: ...
    @property
    def prompt_tokens(self) -> int: ...
    @property
    def cached_tokens(self) -> int: ...
    @property
    def completion_tokens(self) -> int: ...
    @property
    def finish_reason(self) -> str | None: ...
    @property
    def matched_stop(self) -> int | str | None: ...
    @property
    def error(self) -> str | None: ...


def finish_reason(status: RequestStatus) -> dict[str, Any]:
    if status.finish_reason == "stop":
        return {"type": "stop", "matched": status.matched_stop}
    if status.finish_reason == "length":
        return {"type": "length", "length": status.completion_tokens}
    return {"type": "abort", "message": status.error or "request aborted"}


def meta_info(tokenizer: "Tokenizer", status: RequestStatus, *, finished: bool, e2e_latency: float | None = None,
              return_logprob: bool = False, with_text: bool = False, prompt_ids: Sequence[int] = (),
              logprob_start_len: int = -1, input_logprobs: "list[TokenLogprob] | None" = None,
              output_logprobs: "list[TokenLogprob] | None" = None, weight_version: str | None = None) -> dict[str, Any]:
    """A request's meta_info so far (finish_reason is None until it finishes). With return_logprob, the
    four logprob lists of [logprob, token_id, text or None] entries (text only with `with_text`).
    `weight_version`: the served weights' version (SGLang's field), where the caller knows it."""
    meta: dict[str, Any] = {
        "id": status.rid,
        "finish_reason": finish_reason(status) if finished else None,
        "prompt_tokens": status.prompt_tokens,
        "cached_tokens": status.cached_tokens,
        "completion_tokens": status.completion_tokens,
    }
    if weight_version is not None:
        meta["weight_version"] = weight_version
    if finished and e2e_latency is not None:
        meta["e2e_latency"] = e2e_latency
    if return_logprob:
        meta |= _logprob_fields(tokenizer, prompt_ids, logprob_start_len, input_logprobs or [],
                                output_logprobs or [], with_text)
    return meta


def _logprob_fields(tokenizer: "Tokenizer", prompt_ids: Sequence[int], logprob_start_len: int,
                    input_lps: "list[TokenLogprob]", output_lps: "list[TokenLogprob]",
                    with_text: bool) -> dict[str, Any]:
    """The prompt's first token has no logprob (nothing precedes it); like SGLang, it is listed as
    [None, id, text] when logprob_start_len is 0."""
    def entry(logprob: float | None, token_id: int) -> list[Any]:
        return [logprob, token_id, tokenizer.decode([token_id], skip_special_tokens=False) if with_text else None]

    def tokens(lps: "list[TokenLogprob]") -> list[list[Any]]:
        return [entry(lp.logprob, lp.token_id) for lp in lps]

    def tops(lps: "list[TokenLogprob]") -> list[list[list[Any]] | None]:
        return [[entry(v, t) for t, v in lp.top] for lp in lps]

    in_tokens, in_tops = tokens(input_lps), tops(input_lps)
    if logprob_start_len == 0 and prompt_ids:
        in_tokens.insert(0, entry(None, prompt_ids[0]))
        in_tops.insert(0, None)
    return {"input_token_logprobs": in_tokens, "output_token_logprobs": tokens(output_lps),
            "input_top_logprobs": in_tops, "output_top_logprobs": tops(output_lps),
            "output_token_logprobs_length": len(output_lps)}
