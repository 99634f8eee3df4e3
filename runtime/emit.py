"""What a request streams to its sink: a chunk per step it made progress in, and one final chunk."""
from __future__ import annotations

from .execution.sampler import TokenLogprob
from .request import Req, StreamChunk


def emit(req: Req, text: str, token_ids: list[int], logprobs: list[TokenLogprob]) -> None:
    first = req.input_logprobs if req.return_logprob and len(req.output_ids) == 1 else None
    req.sink(StreamChunk(req.rid, text, token_ids, logprobs, prompt_tokens=len(req.prompt_ids),
                         cached_tokens=req.cached_tokens, completion_tokens=len(req.output_ids),
                         input_logprobs=first))


def emit_final(req: Req, reason: str, matched: int | str | None = None, error: str | None = None,
               text: str = "") -> None:
    req.sink(StreamChunk(
        rid=req.rid, text=text, token_ids=[], logprobs=[], finished=True, finish_reason=reason,
        matched_stop=matched, error=error, prompt_tokens=len(req.prompt_ids),
        cached_tokens=req.cached_tokens, completion_tokens=len(req.output_ids),
        input_logprobs=req.input_logprobs if req.return_logprob and not req.output_ids else None,
    ))
