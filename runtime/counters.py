"""Counters the scheduler keeps; `Engine.stats()` reports them with the KV figures."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(slots=True)
class SchedulerCounters:
    steps: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    recomputed_cached_tokens: int = 0  # prompt tokens prefilled again that had been cached and evicted (since a flush)
    generated_tokens: int = 0
    preemptions: int = 0  # every preemption: for KV memory, or for a higher class
    priority_preemptions: int = 0  # of those, for a higher class (scheduler._yield_to_waiting)
    finished: int = 0
    aborted: int = 0
    jump_forward_drafted: int = 0  # tokens proposed by jump-forward
    jump_forward_tokens: int = 0  # drafted tokens the model confirmed: output without a decode step
    spec_draft_tokens: int = 0  # draft tree nodes proposed by the speculative drafter
    spec_verifies: int = 0  # steps that verified such a tree
    spec_accepted_tokens: int = 0  # tree nodes the target accepted
