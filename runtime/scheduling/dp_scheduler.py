"""DP attention's requests: one Scheduler per rank, so one KV owner per rank (its allocator, request table,
radix tree and pins over that rank's own pool), behind the interface the engine asks of one scheduler.

A new request goes to one rank for its whole life (`choose_rank`): the rank that already holds the longest
prefix of its prompt (cached in its radix tree, or in a prompt it is running or has queued) when that saves
enough and the rank is not much busier than the least-loaded one, else the least-loaded rank (SGLang's
data-parallel controller's shortest queue). Pins, aborts and flushes go to every rank.
"""
from __future__ import annotations

from dataclasses import dataclass

from ..config import DP_DISPATCH_MIN_PREFIX, DP_DISPATCH_SLACK
from ..namespace import DEFAULT_NAMESPACE, Namespace
from ..request import Req
from .scheduler import Scheduler, with_ratios


@dataclass(frozen=True, slots=True)
class RankView:
    """What the dispatcher weighs for one rank."""

    prefix: int  # tokens of the prompt this rank holds or is about to compute
    load: int  # requests queued or running there


def choose_rank(views: list[RankView]) -> int:
    """The rank a new request runs on. A short shared prefix (a chat template's header) never outweighs
    load: once every rank holds it, the ranks balance."""
    least = min(range(len(views)), key=lambda r: (views[r].load, r))
    best = max(range(len(views)), key=lambda r: (views[r].prefix, -views[r].load, -r))
    saves = views[best].prefix - views[least].prefix
    if saves >= DP_DISPATCH_MIN_PREFIX and views[best].load - views[least].load <= DP_DISPATCH_SLACK:
        return best
    return least


def common_prefix_len(a: list[int], b: list[int]) -> int:
    """Leading tokens `a` and `b` share (a binary search over slice compares, which run in C)."""
    lo, hi = 0, min(len(a), len(b))
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if a[:mid] == b[:mid]:
            lo = mid
        else:
            hi = mid - 1
    return lo


class DPScheduler:
    """`ranks[r]`: DP rank r's scheduler; the lockstep DPEngineCore (dp_engine_core.py) steps them."""

    def __init__(self, ranks: list[Scheduler]):
        self.ranks = ranks
        self.context_length = ranks[0].context_length

    def add(self, req: Req) -> None:
        holder = next((s for s in self.ranks if req.rid in s.reqs), None)  # its add refuses the id in use
        (holder or self.ranks[self.rank_for(req.prompt_ids, req.namespace)]).add(req)

    def rank_for(self, prompt: list[int], namespace: Namespace = DEFAULT_NAMESPACE) -> int:
        return choose_rank([RankView(self._held_prefix(s, prompt, namespace), len(s.waiting) + len(s.running))
                            for s in self.ranks])

    @staticmethod
    def _held_prefix(s: Scheduler, prompt: list[int], namespace: Namespace) -> int:
        held = s.kv.cached_prefix_len(prompt, namespace) if s.kv.cache_enabled else 0
        for other in (*s.running, *s.waiting):
            if other.namespace == namespace and other.prompt_ids[:1] == prompt[:1] and held < len(prompt):
                held = max(held, common_prefix_len(other.prompt_ids, prompt))
        return held

    def abort(self, rid: str) -> bool:
        return any(s.abort(rid) for s in self.ranks)

    def abort_all(self, error: str | None = None) -> None:
        for s in self.ranks:
            s.abort_all(error)

    @property
    def has_work(self) -> bool:
        return any(s.has_work for s in self.ranks)

    def flush(self) -> bool:
        return all([s.flush() for s in self.ranks])  # a list: every rank flushes

    def unpin(self, owner: str) -> int:
        return sum(s.unpin(owner) for s in self.ranks)

    def unpin_group(self, group: str) -> None:
        for s in self.ranks:
            s.unpin_group(group)

    def check_invariants(self) -> None:
        """Every rank's KV invariant, over its own pool."""
        for s in self.ranks:
            s.check_invariants()

    def stats(self) -> dict[str, float]:
        """Totals over the ranks (the pool: every rank's), ratios from the totals."""
        per_rank = [s.stats() for s in self.ranks]
        totals = {key: sum(stats[key] for stats in per_rank) for key in per_rank[0]}
        return with_ratios(totals)
