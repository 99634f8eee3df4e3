"""One request as the engine takes it: validated once, at the edge, by `RequestValidator.build`.

server/ builds these with `RequestValidator.build`, lang/ and Python callers through `Engine.prepare`;
`Engine.submit` is the one way in. Nothing after the edge checks a field again or re-packs the request
into a dict.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

from .namespace import DEFAULT_NAMESPACE, Namespace
from .sampling_params import SamplingParams

if TYPE_CHECKING:
    from .constrained.matcher import Constraint
    from .image_span import ImageSpan
    from .lora.adapter import LoraAdapter


SESSION = "session:"  # owner prefix of a prompt_cache_key session (programs use "program:")


@dataclass(frozen=True, slots=True)
class Retention:
    """What a request asks to keep once it finishes: its whole sequence pinned for `owner`."""

    owner: str
    group: str | None = None  # released together; None: the owner alone
    ttl: float | None = None  # seconds; None: the engine's prompt_cache_retention; math.inf: until released

    @classmethod
    def session(cls, key: str) -> "Retention":
        return cls(SESSION + key)


@dataclass(frozen=True, slots=True)
class Submission:
    """One sample of one prompt, ready to become a `Req`: every field is validated."""

    rid: str
    prompt_ids: list[int]  # image placeholders already expanded into their spans' pad ids
    params: SamplingParams  # n == 1: a request for n samples is n submissions
    return_logprob: bool = False
    logprob_start_len: int = -1  # first prompt position to score, in the expanded prompt; -1: none
    top_logprobs_num: int = 0
    constraint: Constraint | None = None  # compiled from params' regex / json_schema / grammar
    images: list[ImageSpan] = field(default_factory=list)
    retain: Retention | None = None  # keep the finished sequence pinned (a session / program state)
    priority: int = 0  # SGLang's request priority: larger is admitted first, and may preempt (schedule_policy.py)
    namespace: Namespace = DEFAULT_NAMESPACE  # KV is reused only within it: a tenant, an adapter (namespace.py)
    lora: LoraAdapter | None = None  # the LoRA adapter it runs (its namespace is already the adapter's); None: base


@dataclass(frozen=True, slots=True)
class SubmissionBatch:
    """What one call asked for: its submissions prompt-major (prompt i's samples together)."""

    requests: list[Submission]
    prompt_rids: list[str]  # one per prompt: a sample's rid is its prompt's, or `{rid}-{j}` when n > 1
    single: bool  # one prompt given bare (not in a list): a caller gets one result, not a list
    n: int = 1
    # for n > 1, each distinct prompt once with max_new_tokens=0, run first so the samples share its KV
    shared_prefills: list[Submission] = field(default_factory=list)

    @property
    def rids(self) -> list[str]:
        return [s.rid for s in self.requests]

    def groups(self) -> dict[str, list[str]]:
        """Each prompt's rid -> its samples' rids (a connection aborts them together)."""
        rids, n = self.rids, self.n
        return {r: rids[i * n:(i + 1) * n] for i, r in enumerate(self.prompt_rids)}


def sample_rids(rids: Sequence[str], n: int) -> list[str]:
    """The request id of each of the n samples of each prompt: the prompt's own rid when n == 1."""
    return list(rids) if n == 1 else [f"{r}-{j}" for r in rids for j in range(n)]
