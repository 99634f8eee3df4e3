"""Continuous batching over the radix cache: each step picks running decodes plus prefill chunks.

The scheduler is policy over requests and the KV owner only: which requests run this step, how many
tokens each, whom to preempt (`schedule`), and ending the requests the step's outputs say are done
(`apply`). It runs no model: `EngineCore.step` (runtime/execution/engine_core.py) calls the runner and the output
processor between the two. Every state change of a request happens on the engine's scheduler thread.
"""
from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Callable, Iterable, Protocol

import torch

from ..batch import Finish, ScheduledItem, StepBatch
from ..config import EngineConfig
from ..counters import SchedulerCounters
from ..draft_tree import item_parents
from ..emit import emit_final
from ..kv.kv_manager import KVManager
from ..kv.radix_cache import RadixCache
from ..namespace import Namespace
from ..request import Req, ReqState
from .fair_share import FairShare, account
from .schedule_policy import order_waiting, rank

if TYPE_CHECKING:
    from ..lora.pool import LoraPool
    from ..submission import Retention

RESERVE_CLIP = 4096  # cap on one request's reserved future tokens


class DraftState(Protocol):
    """What the scheduler asks of the drafter (speculative/drafter.Drafter), which holds per-request state
    (a draft model's KV) that must end when the request leaves the running set."""

    def forget(self, req: Req, finished: bool) -> None: ...

    def flush(self) -> bool: ...

    def check(self, running: Iterable[Req]) -> None: ...


@dataclass
class Scheduler:
    cfg: EngineConfig
    kv: KVManager
    context_length: int
    drafter: DraftState | None = None  # None: no speculative decoding
    lora: LoraPool | None = None  # the LoRA adapters served (None: none): at most its num_slots run at once
    waiting: list[Req] = field(default_factory=list)
    running: list[Req] = field(default_factory=list)  # admitted, in admission order
    counters: SchedulerCounters = field(default_factory=SchedulerCounters)
    # a weight update is draining: requests never admitted wait, admitted ones (preempted too) run to their end
    hold_new: bool = False
    clock: Callable[[], float] = time.monotonic  # when tenants were last active (tenant_active_seconds)

    def __post_init__(self) -> None:
        self.reqs: dict[str, Req] = {}
        self.new_token_ratio = self.cfg.init_new_token_ratio
        fair = not self.cfg.disable_tenant_fairness
        self.fair = FairShare(output_weight=self.cfg.fair_share_output_weight) if fair else None
        self._shares: dict[Namespace, int] | None = None  # this step's prefill tokens left per tenant (fair only)

    # ---- intake -------------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        if req.rid in self.reqs:
            emit_final(req, "abort", error=f"request id {req.rid!r} is already in use")
            return
        if req.lora is not None:
            if req.lora.retired:  # unloaded between the request's validation and now
                emit_final(req, "abort", error=f"LoRA adapter {req.lora.name!r} was unloaded")
                return
            req.lora.users += 1
        self.reqs[req.rid] = req
        if self.fair is not None:
            self.fair.join(req, self.reqs.values())
        req.queued_step = self.counters.steps
        self.waiting.append(req)
        self.kv.want(req)
        if req.retain is not None:  # the owner is back: its pin is young again
            self.kv.pins.refresh(req.retain.owner, self._ttl(req.retain))

    def abort(self, rid: str) -> bool:
        req = self.reqs.get(rid)
        if req is None:
            return False
        self._finish(req, "abort")
        return True

    def abort_all(self, error: str | None = None) -> None:
        for req in list(self.reqs.values()):
            self._finish(req, "abort", error=error)

    @property
    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- one step -------------------------------------------------------------------------------
    def schedule(self) -> StepBatch | None:
        """This step's batch (KV slots extended for every item), or None when nothing can run."""
        self.kv.pins.expire()
        items = self._schedule()
        if not items:
            return None
        self.counters.steps += 1
        return StepBatch(items)

    def apply(self, finished: list[Finish]) -> None:
        """Ends the requests the step's outputs decided are done: frees their KV, sends their last chunk."""
        for f in finished:
            self._finish(f.req, f.reason, f.matched, f.error)

    def _schedule(self) -> list[ScheduledItem]:
        if self.waiting and self.running and not self.hold_new:
            self._yield_to_waiting()
        self._shares, first_token = self._prefill_shares()
        items = self._fill_step()
        if not items and first_token:
            # the request the step was kept for could not be admitted (no KV room yet): rather than an
            # empty step, the other tenants' chunks run (nothing was extended, so nothing is undone)
            self._shares, _ = self._prefill_shares(first_token=False)
            items = self._fill_step()
        if self.fair is not None:
            self.fair.charge(items)
        if items and all(item.length == 1 for item in items):
            self.new_token_ratio = max(self.cfg.min_new_token_ratio,
                                       self.new_token_ratio - self.cfg.new_token_ratio_decay)
        return items

    def _fill_step(self) -> list[ScheduledItem]:
        items, budget = self._schedule_running()
        if budget > 0 and self.waiting:  # a pure decode step skips admission's per-step setup
            items += self._admit(budget)
        return items

    def _schedule_running(self) -> tuple[list[ScheduledItem], int]:
        """Decodes and unfinished extends of admitted requests; preempts when KV runs out."""
        budget = self.cfg.max_prefill_tokens
        plan: list[tuple[Req, int]] = []
        for req in self.running:
            n = req.pending
            limit = min(budget, self._share_left(req))
            if req.draft is not None and n > max(limit, 1):  # a draft is checked in one item
                self._drop_draft(req, keep=max(limit - 1, 0))
                n = req.pending
            if n > 1:
                n = min(n, limit)
                budget -= n
                self._take_share(req, n)
            if n > 0:
                plan.append((req, n))
        while plan and not self.kv.ensure_free(sum(n for _, n in plan)):
            victim = min(reversed(self.running), key=rank)  # the lowest class, newest first
            if len(self.running) == 1:
                # a single request that outgrew the whole pool: end it rather than spin
                self._finish(victim, "length")
            else:
                self._preempt(victim)
            plan = [(r, n) for r, n in plan if r is not victim]
        if not plan:
            return [], budget
        starts = self.kv.extend_all(plan)
        return [self._item(req, start, n) for (req, n), start in zip(plan, starts)], budget

    def _extend(self, req: Req, n: int) -> ScheduledItem:
        return self._item(req, self.kv.extend(req, n), n)

    @staticmethod
    def _item(req: Req, start: int, n: int) -> ScheduledItem:
        parents = item_parents(n, req.draft.parents) if req.draft is not None else None
        return ScheduledItem(req, start, n, parents)

    def _admit(self, budget: int) -> list[ScheduledItem]:
        items: list[ScheduledItem] = []
        reserve = sum(self._future_tokens(r) for r in self.running)
        admitted = RadixCache(lambda slots: None)  # this step's prompts, to spot in-batch sharing
        admitted.shared = self.kv.cache.shared
        adapters = {id(r.lora) for r in self.running if r.lora is not None}
        for req in self._order_waiting():
            if budget <= 0 or self._admission_closed():
                break
            if self.hold_new and req.state is ReqState.WAITING or not self._adapter_fits(req, adapters):
                continue
            share = self._share_left(req)
            if share <= 0 or self._better_next_step(req, admitted):
                continue  # its tenant had its share of this step's prefill: other tenants' requests may go
            item = self._try_admit(req, min(budget, share), reserve)
            if item is None:
                req.blocked = True  # it keeps its place: what live requests free next goes to it
                break
            items.append(item)
            budget -= item.length
            self._take_share(req, item.length)
            reserve += self._future_tokens(req)
            admitted.insert(req.prompt_ids, torch.zeros(len(req.prompt_ids), dtype=torch.int64), req.namespace)
            if req.lora is not None:
                adapters.add(id(req.lora))
        return items

    def _adapter_fits(self, req: Req, running: set[int]) -> bool:
        """Whether req's adapter can run beside the running set's: each step's adapters fit the device's slots."""
        if req.lora is None or self.lora is None or id(req.lora) in running:
            return True
        return len(running) < self.lora.num_slots

    def _order_waiting(self) -> list[Req]:
        ordered = order_waiting(self.waiting, self.cfg.schedule_policy, self.kv.cache, self.counters.steps)
        return ordered if self.fair is None else self.fair.order(ordered)

    def _prefill_shares(self, first_token: bool = True) -> tuple[dict[Namespace, int] | None, bool]:
        """Each tenant's prefill tokens this step (None: the whole budget, as with one tenant), and whether
        the step is kept for requests waiting for their first token.

        With k tenants active (a live request, or one within tenant_active_seconds), a tenant's prefill
        chunks take at most 1/k of the step's prefill budget and at most tenant_prefill_chunk tokens: a
        step's length is what a newly arrived request of another tenant waits for, so no tenant may make
        it long. And when a light tenant (one request at a time while active) has its request waiting, not
        yet admitted, that tenant's prefill gets room for the whole prompt (within the budget) and the other
        tenants' none: the request is prefilled whole in the very next step, beside the running decodes
        only. (A flooder whose requests all ended at once has nothing admitted either, but it had many
        live: its next prompts go in chunks, or every cycle of its requests would make one long step.)
        Neither changes what a step
        computes for a request, only how much of its prompt and when (chunking never changes tokens)."""
        if self.fair is None:
            return None, False
        live = Counter(account(r) for r in self.reqs.values())
        active = self.fair.active(live, self.clock(), self.cfg.tenant_active_seconds)
        if len(active) < 2:
            return None, False
        budget = self.cfg.max_prefill_tokens
        share = max(1, budget // len(active))
        if self.cfg.tenant_prefill_chunk:
            share = min(share, self.cfg.tenant_prefill_chunk)
        fresh = self._first_token_tenants() if first_token else {}
        if fresh:
            return {a: min(budget, max(share, fresh[a])) if a in fresh else 0 for a in active}, True
        return dict.fromkeys(active, share), False

    def _first_token_tenants(self) -> dict[Namespace, int]:
        """Light tenants (at most one request live at once while active: FairShare.peak) whose request waits,
        not admitted and not found blocked: each with that request's prompt length. None while no request
        can be admitted: the other tenants' chunks would wait for nothing."""
        assert self.fair is not None
        if self.hold_new or self._admission_closed():
            return {}
        return {account(r): r.pending for r in self.waiting
                if r.state is ReqState.WAITING and not r.blocked and self.fair.peak.get(account(r), 0) <= 1}

    def _share_left(self, req: Req) -> int:
        return self.cfg.max_prefill_tokens if self._shares is None else self._shares.get(account(req), 0)

    def _take_share(self, req: Req, n: int) -> None:
        if self._shares is not None:
            self._shares[account(req)] -= n

    def _better_next_step(self, req: Req, admitted: RadixCache) -> bool:
        """Defer a request whose prompt shares a long uncached prefix with one admitted this step:
        next step that prefix is in the tree, so it is computed once instead of twice."""
        if not self.kv.cache_enabled or req.state is not ReqState.WAITING:
            return False
        shared = admitted.match_prefix(req.prompt_ids, req.namespace).length
        if shared < self.cfg.in_batch_share_min:
            return False
        return shared - self.kv.cached_prefix_len(req.prompt_ids, req.namespace) >= self.cfg.in_batch_share_min

    def _try_admit(self, req: Req, budget: int, reserve: int) -> ScheduledItem | None:
        reserve += self._future_tokens(req)
        waive = not self.running  # with nothing running a request that could run alone must not wait

        def fits(n: int) -> bool:
            return self.kv.can_fit(n, reserve, waive)

        if req.swapped is not None:
            if not self.kv.swap_in(req, fits):
                return None
            self._move_to_running(req)
            return self._extend(req, req.pending)
        match_limit = self._match_limit(req)
        n = self.kv.admit(req, match_limit, budget, fits)
        if n is None:
            return None
        if req.state is ReqState.WAITING:
            req.cached_tokens = req.kv_len
            self.counters.prompt_tokens += len(req.prompt_ids)
            self.counters.cached_tokens += req.kv_len
            self.counters.recomputed_cached_tokens += self.kv.previously_cached(req.tokens(0, match_limit), req.kv_len,
                                                                                req.namespace)
        self._move_to_running(req)
        return self._extend(req, n)

    def _yield_to_waiting(self) -> None:
        """Priority preemption, as SGLang's: when the request admission tries first outranks running ones
        (`rank`: a session's returning turn over one-shot requests) and finds no room, running requests of
        a lower class, the lowest and newest first, are preempted until it fits. Their computed KV stays
        in the radix tree (the host tier once evicted), so they resume cheaply. Bounded: a request yields
        once at most, and a preempted one keeps its queue age, so within STARVATION_STEPS steps it goes
        ahead of every class. Runs before this step extends any slot, so a victim is in no item."""
        low = min(rank(r) for r in self.running)
        if max(rank(r) for r in self.waiting) <= low:
            return
        head = self._order_waiting()[0]
        # with fairness a request outranks only its own tenant's: priority orders a tenant's own requests
        victims = [r for r in self.running if rank(r) < rank(head) and not r.yielded
                   and (self.fair is None or account(r) == account(head))]
        if not victims:
            return
        need = self._admission_need(head)
        reserve = sum(self._future_tokens(r) for r in self.running) + self._future_tokens(head)
        freed = sum(v.slot_len for v in victims)  # at most: slots they own and prefixes they alone lock
        if self.kv.reachable_slots + freed < need + reserve - sum(self._future_tokens(v) for v in victims):
            return  # preempting all of them would not make room: preempt none
        victims.sort(key=rank, reverse=True)  # stable: pop() takes the lowest class, newest first
        while victims and self._blocked(need, reserve):
            victim = victims.pop()
            reserve -= self._future_tokens(victim)
            victim.yielded = True
            self.counters.priority_preemptions += 1
            self._preempt(victim, pressure=False)

    def _admission_need(self, req: Req) -> int:
        """The slots admitting `req` takes this step: its uncached tokens (or swapped KV), within the budget."""
        if req.swapped is not None:
            return req.kv_len + req.pending
        cached = self.kv.cached_prefix_len(req.tokens(0, self._match_limit(req)), req.namespace)
        return min(req.fill_len - cached, self.cfg.max_prefill_tokens)

    @staticmethod
    def _match_limit(req: Req) -> int:
        """How much of `req`'s prompt may come from the cache: never its last token (recomputed for its
        logits), nor a prompt position whose logprob is still wanted."""
        limit = req.fill_len - 1
        return min(limit, req.next_prompt_logit) if req.wants_prompt_logprobs else limit

    def _admission_closed(self) -> bool:
        """No request can be admitted this step: the running set or the request table is full."""
        return len(self.running) >= self.cfg.max_running_requests or self.kv.num_free_rows == 0

    def _blocked(self, need: int, reserve: int) -> bool:
        """Whether admitting a request that needs `need` slots, with `reserve` still reachable, must wait now."""
        return self._admission_closed() or not self.kv.can_fit(need, reserve, not self.running)

    def _move_to_running(self, req: Req) -> None:
        self.waiting.remove(req)
        self.running.append(req)
        req.state = ReqState.RUNNING
        req.blocked = False

    def _future_tokens(self, req: Req) -> int:
        remaining = req.max_new_tokens - len(req.output_ids) - req.num_draft
        return int(min(remaining, RESERVE_CLIP) * self.new_token_ratio)

    # ---- preemption and drafts ----------------------------------------------------------------
    def _drop_draft(self, req: Req, keep: int = 0) -> None:
        """Discards draft tokens after the first `keep`, with any KV computed for them."""
        draft = req.draft
        if draft is None or req.num_draft <= keep:
            return
        if req.row is not None:
            self.kv.truncate(req, len(req.prompt_ids) + len(req.output_ids) + keep)
        del draft.tokens[keep:]
        del draft.parents[keep:]  # a prefix of a tree's nodes is a tree
        if not keep:
            req.draft = None

    def _preempt(self, req: Req, pressure: bool = True, keep_kv: bool = True) -> None:
        """Back to the queue, its computed KV to the tree (or swapped out; with keep_kv False, dropped).
        `pressure`: preempted because KV ran out (not for a higher class), so admission is more conservative
        for a while."""
        self._drop_draft(req)  # the draft is re-proposed after the request resumes
        if self.drafter is not None:
            self.drafter.forget(req, finished=False)  # draft KV goes to the draft cache, like the target's
        self.running.remove(req)
        self.counters.preemptions += 1
        if not keep_kv:
            self.kv.release(req, cache_computed=False)
        elif self.cfg.preemption_mode == "swap" and req.kv_len > 0:
            self.kv.swap_out(req)
        else:
            self.kv.release(req)
        req.state = ReqState.PREEMPTED
        self.waiting.insert(0, req)
        self.kv.want(req)
        if pressure:
            self.new_token_ratio = self.cfg.init_new_token_ratio  # admit more conservatively for a while

    # ---- finishing ------------------------------------------------------------------------------
    def _finish(self, req: Req, reason: str, matched: int | str | None = None, error: str | None = None) -> None:
        if req.done:
            return
        self._drop_draft(req)
        if req in self.running:
            self.running.remove(req)
        elif req in self.waiting:
            self.waiting.remove(req)
        computed = req.tokens(0, req.kv_len)
        self.kv.release(req)
        if req.retain is not None:
            self._retain(req, req.retain, computed, reason)
        if self.drafter is not None:
            self.drafter.forget(req, finished=reason != "abort")
        if req.lora is not None and self.lora is not None and self.lora.release(req.lora):
            self.kv.drop_namespaces("adapter", req.lora.key)  # an unloaded adapter's last request: its KV goes
        req.state = ReqState.ABORTED if reason == "abort" else ReqState.FINISHED
        self.reqs.pop(req.rid, None)
        if reason == "abort":
            self.counters.aborted += 1
        else:
            self.counters.finished += 1
        tail = "" if isinstance(matched, str) else req.detok.flush()  # a stop string released its text
        emit_final(req, reason, matched, error, tail)

    def _retain(self, req: Req, retain: Retention, computed: list[int], reason: str) -> None:
        """A finished sequence stays pinned for its owner; an aborted one releases the owner's pin."""
        if reason == "abort":
            self.kv.pins.unpin(retain.owner)
        elif computed:
            self.kv.pin(retain.owner, computed, self._ttl(retain), retain.group, req.namespace)

    def _ttl(self, retain: Retention) -> float:
        return self.cfg.prompt_cache_retention if retain.ttl is None else retain.ttl

    # ---- weight updates -------------------------------------------------------------------------
    @property
    def drained(self) -> bool:
        """No admitted request is left (running, or preempted and waiting to resume): under hold_new, the
        weights may change without a request seeing both."""
        return not self.running and all(r.state is ReqState.WAITING for r in self.waiting)

    def retract_all(self) -> None:
        """Every admitted request back to the queue with its KV dropped, and any swapped-out KV too: after a
        weight update they recompute their tokens so far on the new weights (SGLang's retract)."""
        for req in list(self.running):
            self._preempt(req, pressure=False, keep_kv=False)
        for req in self.waiting:
            if req.swapped is not None:
                req.swapped, req.kv_len = None, 0

    # ---- what the engine asks -------------------------------------------------------------------
    def flush(self) -> bool:
        """Evicts every cached prefix not in use (the drafter's too); True when nothing cached is left."""
        drafter_empty = self.drafter is None or self.drafter.flush()
        return self.kv.flush() and drafter_empty

    def check_invariants(self) -> None:
        self.kv.pins.expire()
        self.kv.check(self.running, self.waiting)
        if self.drafter is not None:
            self.drafter.check(self.running)

    def stats(self) -> dict[str, float]:
        self.kv.pins.expire()
        s = self.counters
        pins = self.kv.pins
        return with_ratios({
            "kv_pinned_tokens": self.kv.cache.pinned_size,
            "kv_pins": len(pins.pins),
            "pins_released_under_pressure_total": pins.stats.released_under_pressure,
            "pins_expired_total": pins.stats.expired,
            "recomputed_cached_tokens_total": s.recomputed_cached_tokens,
            "host_cache_tokens": self.kv.host.cache.total_size if self.kv.host else 0,
            "host_restored_tokens_total": self.kv.host.restored_tokens if self.kv.host else 0,
            "running_requests": len(self.running),
            "waiting_requests": len(self.waiting),
            "kv_pool_tokens": self.kv.num_slots,
            "kv_free_tokens": self.kv.num_free_slots,
            "kv_cached_tokens": self.kv.cached_tokens,
            "prompt_tokens_total": s.prompt_tokens,
            "cached_tokens_total": s.cached_tokens,
            "generated_tokens_total": s.generated_tokens,
            "preemptions_total": s.preemptions,
            "priority_preemptions_total": s.priority_preemptions,
            "finished_requests_total": s.finished,
            "aborted_requests_total": s.aborted,
            "steps_total": s.steps,
            "jump_forward_drafted_total": s.jump_forward_drafted,
            "jump_forward_tokens_total": s.jump_forward_tokens,
            "spec_draft_tokens_total": s.spec_draft_tokens,
            "spec_verify_steps_total": s.spec_verifies,
            "spec_accepted_tokens_total": s.spec_accepted_tokens,
        })

    # ---- pins, by owner ---------------------------------------------------------------------------
    def unload_adapter(self, name: str) -> None:
        """Stops serving adapter `name`; it and its cached KV go now if no request runs it, else when the last ends."""
        assert self.lora is not None, "the engine checks that the model serves adapters"
        adapter = self.lora.remove(name)
        if adapter.users == 0:
            self.kv.drop_namespaces("adapter", adapter.key)

    def unpin(self, owner: str) -> int:
        """Drops `owner`'s pin; how many tokens it pinned (0: none)."""
        return self.kv.pins.unpin(owner)

    def unpin_group(self, group: str) -> None:
        self.kv.pins.unpin_group(group)


def with_ratios(totals: dict[str, float]) -> dict[str, float]:
    """The stats' ratios from their totals (one scheduler's, or the sums over DP-attention ranks)."""
    t = totals
    return t | {
        "kv_usage": 1.0 - t["kv_free_tokens"] / t["kv_pool_tokens"],
        "cache_hit_rate": t["cached_tokens_total"] / t["prompt_tokens_total"] if t["prompt_tokens_total"] else 0.0,
        "spec_accept_length": (t["spec_accepted_tokens_total"] / t["spec_verify_steps_total"]
                               if t["spec_verify_steps_total"] else 0.0),
    }
