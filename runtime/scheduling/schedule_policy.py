"""The order in which waiting requests are considered for admission.

least-prefill (the default) admits first the requests with the fewest tokens left to prefill once their
cached prefix is reused: an agent's next turn on its pinned history (a short extend) goes before a cold
prompt, and a short prompt before a long one, so the turns that can answer soonest are not queued behind
prefill they do not need (shortest-job-first on the prefill, as Autellix and vLLM's short-prompt
preference do). A request passed over for STARVATION_STEPS steps goes ahead of every shorter one, in
arrival order, so a long prompt waits a bounded number of steps however many short ones arrive.

Shortest-first orders compute, not memory. A request admission found no KV room for (`blocked`: its
prompt, or its copy-back from the host tier, needs more slots than live requests leave) keeps its place
from then on: within its class it goes before every request not yet tried, oldest first, and admission
stops at it, so the slots that live requests free go to it and not to later, smaller requests. Without
this, when memory is the bottleneck, the request needing the most slots is overtaken by each later one
that fits in what the last finished request freed, and waits until STARVATION_STEPS, a minute on a busy
CPU (the starvation that EASY backfilling's reservation for the queue's head prevents; vLLM's FCFS
queue never reorders). The policy still orders everything admission has not found blocked.

Under every policy, requests are first ordered by class (`rank`): a larger `priority` (SGLang's request
field: larger first) goes first, and at equal priority a session's or program's request (one that carries a
retention owner: the engine was told its owner comes back and extends what it keeps) before a one-shot one.
The policy orders requests within a class. The same starvation rule bounds the classes: a request queued
STARVATION_STEPS steps goes ahead of every class, so background work is delayed, never starved.
"""
from __future__ import annotations

from collections import defaultdict

from ..config import SCHEDULE_POLICIES
from ..kv.radix_cache import RadixCache, TreeNode
from ..request import Req, ReqState

LPM_MAX_QUEUE = 128  # past this, prefix matching every waiting request each step costs too much
STARVATION_STEPS = 64  # least-prefill: a request queued this many steps is no longer overtaken


def rank(req: Req) -> tuple[int, bool]:
    """A request's class: its priority, then whether it belongs to a session or program (`retain`)."""
    return req.priority, req.retain is not None


def overdue(req: Req, step: int) -> bool:
    """Queued (since arrival; a preemption does not restart the count) for STARVATION_STEPS steps or more."""
    return step - req.queued_step >= STARVATION_STEPS


def order_waiting(waiting: list[Req], policy: str, cache: RadixCache, step: int = 0) -> list[Req]:
    """Overdue requests first, then by class (`rank`, larger first), and within a class preempted requests
    first, then blocked ones (each oldest first), then the rest by `policy`; `step` is the scheduler's step
    count now."""
    ordered = _policy_order(waiting, policy, cache, step)
    if len({rank(r) for r in ordered}) > 1:  # stable: the policy's order within a class
        ordered.sort(key=lambda r: (not overdue(r, step), -r.priority, r.retain is None))
    return ordered


def _policy_order(waiting: list[Req], policy: str, cache: RadixCache, step: int) -> list[Req]:
    resumed = [r for r in waiting if r.state is ReqState.PREEMPTED]
    blocked = sorted((r for r in waiting if r.blocked and r.state is not ReqState.PREEMPTED),
                     key=lambda r: r.queued_step)  # stable: arrival order within a step
    fresh = [r for r in waiting if not r.blocked and r.state is not ReqState.PREEMPTED]
    first = resumed + blocked
    if policy == "fcfs" or cache.disable or len(fresh) > LPM_MAX_QUEUE:
        return first + fresh
    matches = {id(r): cache.match_prefix(r.prompt_ids, r.namespace) for r in fresh}
    if policy == "least-prefill":
        late = [r for r in fresh if overdue(r, step)]
        rest = [r for r in fresh if not overdue(r, step)]
        rest.sort(key=lambda r: len(r.prompt_ids) - matches[id(r)].length)  # stable: ties keep arrival order
        return first + late + rest
    if policy == "lpm":
        fresh.sort(key=lambda r: -matches[id(r)].length)  # stable: ties keep arrival order
        return first + fresh
    if policy == "dfs-weight":
        return first + _dfs_weight_order(fresh, {id(r): matches[id(r)].node for r in fresh})
    raise ValueError(f"unknown schedule policy {policy!r}; choose from {SCHEDULE_POLICIES}")


def _dfs_weight_order(reqs: list[Req], node_of: dict[int, TreeNode]) -> list[Req]:
    """Walk the tree heaviest subtree first, so requests sharing a prefix run back to back (each namespace's
    root is a tree of its own; the heaviest goes first)."""
    at_node: dict[int, list[Req]] = defaultdict(list)
    weight: dict[int, int] = defaultdict(int)
    roots: dict[int, TreeNode] = {}
    for r in reqs:
        node = node_of[id(r)]
        at_node[id(node)].append(r)
        while True:
            weight[id(node)] += 1
            if node.parent is None:
                roots[id(node)] = node
                break
            node = node.parent
    out: list[Req] = []
    stack = sorted(roots.values(), key=lambda n: weight[id(n)])  # heaviest popped first
    while stack:
        node = stack.pop()
        out.extend(at_node.get(id(node), ()))
        children = [c for c in node.children.values() if weight.get(id(c))]
        children.sort(key=lambda c: weight[id(c)])  # heaviest popped first
        stack.extend(children)
    return out
