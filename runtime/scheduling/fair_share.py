"""Fairness across tenants: admission goes to the tenant that has received the least service.

The virtual token counter (VTC) of Sheng et al., "Fairness in Serving Large Language Models" (OSDI 2024):
each tenant (its cache namespace's `tenant`: an adapter's namespace in it counts as it) has a counter of the service it has
received, in weighted tokens: every token a step computes for it adds `prompt_weight` (a prompt token
prefilled) or `output_weight` (a generated one, dearer: decoding is memory-bound). Admission considers
the waiting requests tenant by tenant, least-served first: a tenant that sends one request now and then
goes ahead of one that keeps a queue full, however many requests that one has waiting.

A tenant that comes back after being idle gets its counter raised to the least counter among the tenants
with live requests (the paper's "lift"): it cannot bank credit while away and then monopolise the server,
and it is not penalised for what others received while it was away.

Within a tenant the order is the scheduler's own (runtime/scheduling/schedule_policy.py): starvation age,
priority, sessions before one-shot requests, preempted and blocked requests first, then the cache-aware
policy. So `priority` orders a tenant's own requests and does not let one tenant jump over another. With
one tenant (a server without API keys) the order is exactly the policy's.

How long a step may be while several tenants are active, and the step kept for a light tenant's new
request, are the scheduler's (Scheduler._prefill_shares); `active` says which tenants count.

Batch invariance is untouched: fairness decides only when a request is admitted and how its prompt is
chunked, never what it computes.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

from ..batch import ScheduledItem
from ..namespace import Namespace
from ..request import Req


def account(req: Req) -> Namespace:
    """Whose service `req` counts as: its tenant (the default namespace on a server without keys)."""
    return req.namespace.tenant


@dataclass
class FairShare:
    prompt_weight: float = 1.0
    output_weight: float = 2.0
    counters: dict[Namespace, float] = field(default_factory=dict)  # service received, in weighted tokens
    last_live: dict[Namespace, float] = field(default_factory=dict)  # when each tenant last had a live request
    peak: dict[Namespace, int] = field(default_factory=dict)  # most requests each had live at once while active

    def active(self, live: dict[Namespace, int], now: float, window: float) -> set[Namespace]:
        """The tenants with a live request now (`live`: how many each), or with one within the last `window`
        seconds: a client that sends its next request once the last one ends is not gone in between (the
        step bounds of Scheduler._prefill_shares hold for it)."""
        for a, n in live.items():
            self.last_live[a] = now
            self.peak[a] = max(self.peak.get(a, 0), n)
        for a in [a for a, t in self.last_live.items() if now - t > window]:
            del self.last_live[a], self.peak[a]
        return set(self.last_live)

    def join(self, req: Req, live: Iterable[Req]) -> None:
        """`req` arrives; `live` are the scheduler's other live requests. A tenant with none of them is
        lifted to the least counter among the tenants that have some (VTC's lift on a new backlog)."""
        mine = account(req)
        others = {account(r) for r in live if r is not req}
        if mine in others:
            return
        floor = min((self.counters.get(a, 0.0) for a in others), default=None)
        if floor is not None:
            self.counters[mine] = max(self.counters.get(mine, 0.0), floor)

    def charge(self, items: Iterable[ScheduledItem]) -> None:
        """A step's service: each item's prompt tokens at `prompt_weight`, the rest at `output_weight`."""
        for item in items:
            prompt = max(0, min(item.end, len(item.req.prompt_ids)) - item.start)
            cost = self.prompt_weight * prompt + self.output_weight * (item.length - prompt)
            key = account(item.req)
            self.counters[key] = self.counters.get(key, 0.0) + cost

    def order(self, ordered: list[Req]) -> list[Req]:
        """`ordered` (the policy's order) interleaved across tenants: each next request is the head of the
        least-served tenant's queue, counting what admitting the ones before it would charge (their
        tokens left to compute, at prompt_weight). Ties keep the policy's order."""
        queues: dict[Namespace, list[Req]] = {}
        for req in ordered:
            queues.setdefault(account(req), []).append(req)
        if len(queues) < 2:
            return ordered
        counters = {a: self.counters.get(a, 0.0) for a in queues}
        heads = {a: 0 for a in queues}
        place = {id(r): i for i, r in enumerate(ordered)}  # ties: whose head comes first in the policy's order
        out: list[Req] = []
        while len(out) < len(ordered):
            pick = min((a for a in queues if heads[a] < len(queues[a])),
                       key=lambda a: (counters[a], place[id(queues[a][heads[a]])]))
            req = queues[pick][heads[pick]]
            heads[pick] += 1
            counters[pick] += self.prompt_weight * req.pending
            out.append(req)
        return out
