"""What a caller gets back: a finished request's text, ids and meta, folded from its stream chunks."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .execution.sampler import TokenLogprob
from .request import StreamChunk


@dataclass(slots=True)
class CompletionMeta:
    rid: str
    prompt_tokens: int
    cached_tokens: int
    completion_tokens: int
    finish_reason: str  # "stop" | "length" | "abort"
    matched_stop: int | str | None = None
    error: str | None = None
    input_logprobs: list[TokenLogprob] | None = None  # scores prompt tokens from logprob_start_len on
    output_logprobs: list[TokenLogprob] | None = None


@dataclass(slots=True)
class Completion:
    text: str
    output_ids: list[int]
    meta: CompletionMeta


@dataclass
class Collector:
    """Folds a request's stream chunks into one Completion."""

    text: list[str] = field(default_factory=list)
    ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    input_logprobs: list[TokenLogprob] | None = None

    def add(self, chunk: StreamChunk) -> None:
        self.text.append(chunk.text)
        self.ids.extend(chunk.token_ids)
        self.logprobs.extend(chunk.logprobs)
        if chunk.input_logprobs is not None:
            self.input_logprobs = chunk.input_logprobs

    def result(self, last: StreamChunk, with_logprobs: bool) -> Completion:
        meta = CompletionMeta(
            rid=last.rid, prompt_tokens=last.prompt_tokens, cached_tokens=last.cached_tokens,
            completion_tokens=last.completion_tokens, finish_reason=last.finish_reason or "abort",
            matched_stop=last.matched_stop, error=last.error,
            input_logprobs=self.input_logprobs if with_logprobs else None,
            output_logprobs=self.logprobs if with_logprobs else None,
        )
        return Completion("".join(self.text), self.ids, meta)


def collecting_sink(with_logprobs: bool, deliver: Callable[[Completion], None]) -> Callable[[StreamChunk], None]:
    """A request sink that folds chunks where they are made (the scheduler thread) and hands over only the
    Completion: a blocking caller wakes once per request, not once per token, and so does not contend
    with the scheduler thread for the interpreter at every step."""
    collector = Collector()

    def sink(chunk: StreamChunk) -> None:
        collector.add(chunk)
        if chunk.finished:
            deliver(collector.result(chunk, with_logprobs))
    return sink
