"""A request as the scheduler sees it, and what it reports back each step.

A leaf of the runtime: it imports no feature package (constrained/, multimodal/, speculative/); a
request's constraint is typed by the `ConstraintCursor` protocol, and `engine.create_req`
builds requests with their feature state.

The lengths of a request, each in tokens (the KV ones are assigned only by the KV owner,
runtime/kv/kv_manager.py):
  len(prompt_ids)   the prompt, image spans expanded;
  len(output_ids)   verified output tokens (only these are ever streamed or reported);
  num_draft         unverified draft tokens after them (`draft.tokens`, while `draft` is set);
  fill_len          prompt + output + draft: the sequence whose KV the request is building;
  kv_len            positions whose KV is computed (kv_len <= slot_len, kv_len <= fill_len);
  slot_len          positions with KV slots allocated (a step in flight computes [kv_len, slot_len));
  cached_len        positions held by the radix tree, locked through `last_node` (cached_len <= kv_len);
  cached_tokens     prompt tokens found in the cache at admission (reported to the caller, never changes).
  pending           fill_len - kv_len: tokens whose KV is still to be computed.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Hashable, Protocol, TypeVar

import numpy as np

from .detokenizer import IncrementalDetokenizer
from .draft_tree import Draft
from .execution.sampler import SamplingState, TokenLogprob
from .image_span import ImageSpan
from .kv.memory import SwappedKV
from .kv.radix_cache import TreeNode
from .namespace import DEFAULT_NAMESPACE, Namespace
from .sampling_params import SamplingParams

if TYPE_CHECKING:
    from .lora.adapter import LoraAdapter
    from .submission import Retention


S = TypeVar("S", bound=Hashable)  # a constraint's state (an automaton's: each constraint has its own kind)


class ConstraintStep(Protocol[S]):
    """The compiled constraint (constrained/matcher.Constraint), as drafts are checked against it."""

    def advance(self, state: S, token_id: int) -> S | None: ...


class ConstraintCursor(Protocol[S]):
    """A request's position in its constraint (constrained/matcher.Matcher): what the step loop asks."""

    end_ids: tuple[int, ...]  # EOS ids that may end the output where the constraint can end

    @property
    def constraint(self) -> ConstraintStep[S]: ...

    @property
    def state(self) -> S: ...

    def mask_words(self, state: S, produced: int | None = None) -> np.ndarray: ...

    def is_complete(self, state: S | None = None) -> bool: ...

    def closed(self, state: S, produced: int) -> bool: ...

    def no_room(self, state: S, produced: int) -> bool: ...

    def advance(self, token_id: int) -> bool: ...

    def forced_bytes(self) -> bytes: ...


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
    """A sequence's KV bookkeeping, assigned only by the KV owner (runtime/kv/kv_manager.py, which says what
    they mean): requests, and the draft model's copies of them."""

    row: int | None = None
    kv_len: int = 0
    slot_len: int = 0
    cached_len: int = 0
    last_node: TreeNode | None = None
    swapped: SwappedKV | None = None
    wanted: TreeNode | None = None  # while queued: the end of the cached prefix it will hit (evicted last)
    namespace: Namespace = DEFAULT_NAMESPACE  # KV is reused only within it (a tenant, an adapter)


class KVSeq(Protocol):
    """What the KV owner uses of a sequence: the `KVFields`, its id and its tokens. Requests and the draft
    model's copies of them (runtime/speculative/model_drafter.py) both are one."""

    rid: str
    row: int | None
    kv_len: int
    slot_len: int
    cached_len: int
    last_node: TreeNode | None
    swapped: SwappedKV | None
    wanted: TreeNode | None
    namespace: Namespace

    @property
    def fill_len(self) -> int: ...

    @property
    def pending(self) -> int: ...

    def tokens(self, start: int, end: int) -> list[int]: ...


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
    constraint: ConstraintCursor | None = None  # regex / JSON schema / grammar position; None: unconstrained
    draft: Draft | None = None  # a draft tree after output_ids, not yet verified
    images: list[ImageSpan] = field(default_factory=list)  # image spans of prompt_ids (radix keys, not ids)
    retain: Retention | None = None  # pin the sequence once finished (runtime/kv/pins.py)
    priority: int = 0  # SGLang's request priority: larger is admitted first (runtime/scheduling/schedule_policy.py)
    lora: LoraAdapter | None = None  # the LoRA adapter it runs (runtime/lora); None: the base model
    yielded: bool = False  # preempted once for a higher class: never again (so it is delayed, not starved)
    blocked: bool = False  # admission found no KV room for it: later arrivals of its class wait behind it

    state: ReqState = ReqState.WAITING
    queued_step: int = 0  # the scheduler step at which it last joined the queue (least-prefill ages by it)
    output_ids: list[int] = field(default_factory=list)
    cached_tokens: int = 0  # prompt tokens reused from the cache (reported)
    input_logprobs: list[TokenLogprob] = field(default_factory=list)  # from prompt_logprob_from + 1 on

    @property
    def fill_len(self) -> int:
        """Prompt + output + draft: see the module's list of lengths."""
        return len(self.prompt_ids) + len(self.output_ids) + self.num_draft

    @property
    def num_draft(self) -> int:
        return len(self.draft.tokens) if self.draft is not None else 0

    @property
    def pending(self) -> int:
        """Tokens whose KV is still to be computed."""
        return self.fill_len - self.kv_len

    def tokens(self, start: int, end: int) -> list[int]:
        """Tokens [start, end) of prompt + output + draft."""
        p = len(self.prompt_ids)
        if end <= p:
            return self.prompt_ids[start:end]
        tail = self.output_ids if self.draft is None else self.output_ids + self.draft.tokens
        if start >= p:
            return tail[start - p : end - p]
        return self.prompt_ids[start:] + tail[: end - p]

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
