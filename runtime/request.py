"""A request as the scheduler sees it, and what it reports back each step."""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import Callable

import torch

from .constrained.matcher import Constraint, Matcher
from .detokenizer import IncrementalDetokenizer
from .memory import SwappedKV
from .multimodal.prompt import ImageSpan, text_ids
from .pins import Retention
from .radix_cache import TreeNode
from .sampler import SamplingState, TokenLogprob
from .sampling_params import SamplingParams
from .speculative.tree import Draft
from .tokenizer import Tokenizer


class ReqState(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    PREEMPTED = "preempted"
    FINISHED = "finished"
    ABORTED = "aborted"


_DONE = (ReqState.FINISHED, ReqState.ABORTED)  # a tuple: `in` compares identities (Enum hashing is slow)


@dataclass(slots=True)
class StreamChunk:
    """What one scheduler step produced for one request; the last chunk has `finished=True`."""

    rid: str
    text: str
    token_ids: list[int]
    logprobs: list[TokenLogprob]
    finished: bool = False
    finish_reason: str | None = None  # "stop" | "length" | "abort"
    matched_stop: int | str | None = None
    error: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    input_logprobs: list[TokenLogprob] | None = None


@dataclass(eq=False, kw_only=True)
class KVFields:
    """A sequence's KV bookkeeping, assigned only by the KV owner (runtime/kv_manager.py, which says what
    they mean): requests, and the draft model's copies of them."""

    row: int | None = None
    kv_len: int = 0
    slot_len: int = 0
    cached_len: int = 0
    last_node: TreeNode | None = None
    swapped: SwappedKV | None = None


@dataclass(eq=False)
class Req(KVFields):
    rid: str
    prompt_ids: list[int]
    params: SamplingParams
    sampling: SamplingState
    detok: IncrementalDetokenizer
    sink: Callable[[StreamChunk], None]
    max_new_tokens: int  # after clamping to the context
    return_logprob: bool = False
    logprob_start_len: int = -1  # first prompt position to score; -1: none
    top_logprobs_num: int = 0
    constraint: Matcher | None = None  # regex / JSON schema / grammar position; None: unconstrained
    draft: Draft | None = None  # the trailing output_ids are a draft tree's nodes, not yet verified
    images: list[ImageSpan] = field(default_factory=list)  # image spans of prompt_ids (radix keys, not ids)
    retain: Retention | None = None  # pin the sequence once finished (runtime/pins.py)

    state: ReqState = ReqState.WAITING
    output_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens reused from the cache (reported)
    input_logprobs: list[TokenLogprob] = field(default_factory=list)  # from prompt_logprob_from + 1 on

    @classmethod
    def create(cls, rid: str, prompt_ids: list[int], params: SamplingParams, tokenizer: Tokenizer,
               sink: Callable[[StreamChunk], None], *, context_length: int, seed: int,
               device: torch.device, return_logprob: bool = False, logprob_start_len: int = -1,
               top_logprobs_num: int = 0, constraint: Constraint | None = None,
               images: list[ImageSpan] | None = None) -> "Req":
        """A request with its sampler, constraint and detokenizer state; `params` must be validated."""
        token_ids = text_ids(prompt_ids) if images else prompt_ids
        sampling = SamplingState.create(params, token_ids, tokenizer.eos_token_ids,
                                        tokenizer.vocab_size, device, seed)
        matcher = None
        if constraint is not None:  # EOS ends a constrained output unless the caller ignores EOS
            end_ids = tuple(i for i in constraint.vocab.end_ids if i in sampling.stop_ids)
            matcher = Matcher(constraint, end_ids)
        return cls(
            rid=rid,
            prompt_ids=prompt_ids,
            params=params,
            sampling=sampling,
            constraint=matcher,
            detok=IncrementalDetokenizer(tokenizer, params.stop, params.skip_special_tokens,
                                         trim_stop=not params.no_stop_trim, context_ids=token_ids),
            sink=sink,
            max_new_tokens=min(params.max_new_tokens, context_length - len(prompt_ids)),
            return_logprob=return_logprob,
            logprob_start_len=logprob_start_len,
            top_logprobs_num=top_logprobs_num,
            images=list(images or ()),
        )

    @property
    def fill_len(self) -> int:
        return len(self.prompt_ids) + len(self.output_ids)

    @property
    def num_draft(self) -> int:
        return len(self.draft.parents) if self.draft is not None else 0

    @property
    def pending(self) -> int:
        """Tokens whose KV is still to be computed."""
        return self.fill_len - self.kv_len

    def tokens(self, start: int, end: int) -> list[int]:
        p = len(self.prompt_ids)
        if end <= p:
            return self.prompt_ids[start:end]
        if start >= p:
            return self.output_ids[start - p : end - p]
        return self.prompt_ids[start:] + self.output_ids[: end - p]

    @property
    def prompt_logprob_from(self) -> int:
        """The first prompt position whose logits are wanted (they score the token after it)."""
        return max(self.logprob_start_len, 1) - 1

    @property
    def next_prompt_logit(self) -> int:
        """The next prompt position still to be scored (earlier ones survive a preemption)."""
        return self.prompt_logprob_from + len(self.input_logprobs)

    @property
    def wants_prompt_logprobs(self) -> bool:
        return (self.return_logprob and self.logprob_start_len >= 0
                and self.next_prompt_logit < len(self.prompt_ids) - 1)

    @property
    def done(self) -> bool:
        return self.state in _DONE
