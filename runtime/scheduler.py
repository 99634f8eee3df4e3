"""Continuous batching over the radix cache: each step picks running decodes plus prefill chunks.

Every state change of a request happens here, on the engine's scheduler thread. A request's KV slots
go back to the tree (computed tokens) or the allocator (the rest) exactly once, in `_release`.
"""
from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass, field

import torch

from .config import EngineConfig
from .constrained.jump_forward import JumpForwarder
from .memory import KVPool, ReqToToken, SlotAllocator
from .model_runner import ChunkLogits, ModelRunner, ScheduledChunk
from .radix_cache import RadixCache
from .request import Req, ReqState, StreamChunk
from .sampler import TokenLogprob, sample_one, token_logprobs
from .schedule_policy import order_waiting

logger = logging.getLogger(__name__)

RESERVE_CLIP = 4096  # cap on one request's reserved future tokens


@dataclass(slots=True)
class SchedulerStats:
    steps: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    generated_tokens: int = 0
    preemptions: int = 0
    finished: int = 0
    aborted: int = 0
    jump_forward_drafted: int = 0  # tokens proposed by jump-forward
    jump_forward_tokens: int = 0  # drafted tokens the model confirmed: output without a decode step


@dataclass
class Scheduler:
    cfg: EngineConfig
    runner: ModelRunner
    pool: KVPool
    allocator: SlotAllocator
    req_to_token: ReqToToken
    cache: RadixCache
    context_length: int
    waiting: list[Req] = field(default_factory=list)
    running: list[Req] = field(default_factory=list)  # admitted, in admission order
    stats: SchedulerStats = field(default_factory=SchedulerStats)
    jump: JumpForwarder | None = None  # None: jump-forward disabled

    def __post_init__(self) -> None:
        self.reqs: dict[str, Req] = {}
        self.new_token_ratio = self.cfg.init_new_token_ratio

    # ---- intake -------------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        if req.rid in self.reqs:
            self._emit_final(req, "abort", error=f"request id {req.rid!r} is already in use")
            return
        self.reqs[req.rid] = req
        self.waiting.append(req)

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
    def step(self) -> list[ScheduledChunk]:
        """Runs one batch; returns what it scheduled."""
        chunks = self._schedule()
        if not chunks:
            return chunks
        self.stats.steps += 1
        try:
            logits = self.runner.forward(chunks)
            self._process(chunks, logits)
        except Exception as e:  # a failed step must not take the engine down with it
            logger.exception("step failed; aborting its %d request(s)", len(chunks))
            for c in chunks:
                self._finish(c.req, "abort", error=f"internal error: {e!r}")
        return chunks

    def _schedule(self) -> list[ScheduledChunk]:
        chunks, budget = self._schedule_running()
        if budget > 0:
            chunks += self._admit(budget)
        if chunks and all(c.length == 1 for c in chunks):
            self.new_token_ratio = max(self.cfg.min_new_token_ratio,
                                       self.new_token_ratio - self.cfg.new_token_ratio_decay)
        return chunks

    def _schedule_running(self) -> tuple[list[ScheduledChunk], int]:
        """Decodes and unfinished extends of admitted requests; preempts when KV runs out."""
        budget = self.cfg.max_prefill_tokens
        plan: list[tuple[Req, int]] = []
        for req in self.running:
            if req.num_draft and req.pending > max(budget, 1):  # a draft is checked in one chunk
                self._drop_draft(req, keep=max(budget - 1, 0))
            n = req.pending
            if n > 1:
                n = min(n, budget)
                budget -= n
            if n > 0:
                plan.append((req, n))
        while plan and not self._ensure_free(sum(n for _, n in plan)):
            victim = self.running[-1]
            if len(self.running) == 1:
                # a single request that outgrew the whole pool: end it rather than spin
                self._finish(victim, "length")
            else:
                self._preempt(victim)
            plan = [(r, n) for r, n in plan if r is not victim]
        chunks = [self._allocate_chunk(req, n) for req, n in plan]
        return chunks, budget

    def _admit(self, budget: int) -> list[ScheduledChunk]:
        chunks: list[ScheduledChunk] = []
        reserve = sum(self._future_tokens(r) for r in self.running)
        admitted = RadixCache(lambda slots: None)  # this step's prompts, to spot in-batch sharing
        for req in order_waiting(self.waiting, self.cfg.schedule_policy, self.cache):
            if budget <= 0 or len(self.running) >= self.cfg.max_running_requests:
                break
            if self.req_to_token.num_free_rows == 0:
                break
            if self._better_next_step(req, admitted):
                continue
            chunk = self._try_admit(req, budget, reserve)
            if chunk is None:
                break
            chunks.append(chunk)
            budget -= chunk.length
            reserve += self._future_tokens(req)
            admitted.insert(req.prompt_ids, torch.zeros(len(req.prompt_ids), dtype=torch.int64))
        return chunks

    def _better_next_step(self, req: Req, admitted: RadixCache) -> bool:
        """Defer a request whose prompt shares a long uncached prefix with one admitted this step:
        next step that prefix is in the tree, so it is computed once instead of twice."""
        if not self.cache_enabled or req.state is not ReqState.WAITING:
            return False
        shared = admitted.match_prefix(req.prompt_ids).length
        if shared < self.cfg.in_batch_share_min:
            return False
        return shared - self.cache.match_prefix(req.prompt_ids).length >= self.cfg.in_batch_share_min

    def _try_admit(self, req: Req, budget: int, reserve: int) -> ScheduledChunk | None:
        if req.swapped is not None:
            return self._try_swap_in(req, reserve)
        match_limit = req.fill_len - 1  # the last token is always recomputed, for its logits
        if req.wants_prompt_logprobs:
            match_limit = min(match_limit, req.next_prompt_logit)
        match = self.cache.match_prefix(req.tokens(0, match_limit))
        self.cache.inc_lock_ref(match.node)  # before any eviction, so the match survives it
        n = min(req.fill_len - match.length, budget)
        if not self._fits(n, reserve + self._future_tokens(req)):
            self.cache.dec_lock_ref(match.node)
            return None
        req.row = self.req_to_token.alloc_row()
        self.req_to_token.write(req.row, 0, match.slots)
        req.kv_len = req.cached_len = req.slot_len = match.length
        req.last_node = match.node
        if req.state is ReqState.WAITING:
            req.cached_tokens = match.length
            self.stats.prompt_tokens += len(req.prompt_ids)
            self.stats.cached_tokens += match.length
        self._move_to_running(req)
        return self._allocate_chunk(req, n)

    def _try_swap_in(self, req: Req, reserve: int) -> ScheduledChunk | None:
        n = req.pending
        if not self._fits(req.kv_len + n, reserve + self._future_tokens(req)):
            return None
        slots = self.allocator.alloc(req.kv_len)
        self.pool.swap_in(slots, req.swapped)
        req.swapped = None
        req.row = self.req_to_token.alloc_row()
        self.req_to_token.write(req.row, 0, slots)
        req.slot_len = req.kv_len
        req.cached_len, req.last_node = 0, self.cache.root
        self._move_to_running(req)
        return self._allocate_chunk(req, n)

    def _fits(self, n: int, reserve: int) -> bool:
        """Whether n slots can be had now (evicting if needed) with `reserve` more still reachable.

        With nothing running the reserve is waived: otherwise a request that could run alone would
        wait forever."""
        if self.running and self.allocator.num_free + self.cache.evictable_size < n + reserve:
            return False
        return self._ensure_free(n)

    def _move_to_running(self, req: Req) -> None:
        self.waiting.remove(req)
        self.running.append(req)
        req.state = ReqState.RUNNING

    def _future_tokens(self, req: Req) -> int:
        remaining = req.max_new_tokens - len(req.output_ids)
        return int(min(remaining, RESERVE_CLIP) * self.new_token_ratio)

    def _ensure_free(self, n: int) -> bool:
        short = n - self.allocator.num_free
        if short > 0:
            self.cache.evict(short)
        return self.allocator.num_free >= n

    def _allocate_chunk(self, req: Req, n: int) -> ScheduledChunk:
        start = req.kv_len
        slots = self.allocator.alloc(n)
        assert slots is not None, "allocation after _ensure_free cannot fail"
        self.req_to_token.write(req.row, start, slots)
        req.slot_len = start + n
        return ScheduledChunk(req, start, n)

    # ---- after the forward pass -----------------------------------------------------------------
    def _process(self, chunks: list[ScheduledChunk], logits: list[ChunkLogits]) -> None:
        for chunk, out in zip(chunks, logits):
            req = chunk.req
            if req.done:
                continue
            req.kv_len = chunk.end
            if out.prompt is not None:
                req.input_logprobs += self._prompt_logprobs(req, out)
            if chunk.length > 1 and self.cache_enabled:
                self._cache_progress(req)
            if not chunk.completes_fill:
                continue
            if not chunk.samples:
                self._finish(req, "length")
                continue
            self._sample_next(req, out)

    def _prompt_logprobs(self, req: Req, out: ChunkLogits) -> list[TokenLogprob]:
        targets = torch.tensor([req.prompt_ids[p + 1] for p in out.prompt_positions], dtype=torch.int64)
        return token_logprobs(out.prompt, targets.to(out.prompt.device), req.top_logprobs_num)

    def _sample_next(self, req: Req, out: ChunkLogits) -> None:
        """Keeps each jump-forward draft token while sampling at its position reproduces it (greedy:
        the argmax; sampling: a draw, so the output distribution is unchanged), then samples on."""
        base = len(req.output_ids) - req.num_draft
        drafted, accepted, logprobs = req.output_ids[base:], [], []
        token, logits = None, out.next_token
        for j, d in enumerate(drafted):
            token = self._sample(req, out.draft[j], base + j)
            if token != d:  # the model splits or goes on differently: roll the rest of the draft back
                self._truncate_kv(req, len(req.prompt_ids) + base + j)
                logits = out.draft[j]
                break
            token = None
            accepted.append(d)
            if req.return_logprob:
                logprobs += self._logprobs(req, out.draft[j], d)
            req.sampling.observe(d)
            advanced = req.constraint.advance(d)
            assert advanced, "a drafted token follows the constraint"
        del req.output_ids[base:]
        req.num_draft = 0
        self.stats.jump_forward_tokens += len(accepted)
        m = req.constraint
        if token is None and not (m is not None and not m.end_ids and m.is_complete()):
            token = self._sample(req, logits, base + len(accepted))  # else nothing, not even EOS, may follow
        self._append(req, token, logits, accepted, logprobs)

    def _sample(self, req: Req, logits: torch.Tensor, num_out: int) -> int:
        """One token from `logits` under the request's constraint; `num_out` tokens precede it."""
        block_stop = num_out < req.params.min_new_tokens
        mask = None
        if req.constraint is not None:
            mask = req.constraint.mask()
            block_stop = block_stop and not req.constraint.is_complete()  # the constraint may only end
        return sample_one(logits, req.sampling, mask, block_stop)

    def _logprobs(self, req: Req, logits: torch.Tensor, token: int) -> list[TokenLogprob]:
        return token_logprobs(logits.view(1, -1), torch.tensor([token], device=logits.device), req.top_logprobs_num)

    def _append(self, req: Req, token: int | None, logits: torch.Tensor, accepted: list[int],
                logprobs: list[TokenLogprob]) -> None:
        """Appends verified draft tokens and the sampled token (None: the constraint is complete and
        nothing was sampled); streams them; finishes the request when they end it."""
        if token is not None and req.constraint is not None and not req.constraint.advance(token):
            self._finish(req, "abort", error=f"internal error: the constraint rejected sampled token {token}")
            return
        req.output_ids.extend(accepted)
        new = list(accepted)
        if token is not None:
            req.output_ids.append(token)
            req.sampling.observe(token)
            self.stats.generated_tokens += 1
            new.append(token)
            if req.return_logprob:
                logprobs = logprobs + self._logprobs(req, logits, token)
        p, n_out = req.params, len(req.output_ids)
        ended = token in req.sampling.stop_ids
        result = req.detok.add(accepted if ended else new, check_stop=n_out >= p.min_new_tokens)
        if ended and result.stop is None:
            self._emit(req, result.delta + req.detok.flush(), new, logprobs)
            self._finish(req, "stop", matched=token)
            return
        self._emit(req, result.delta, new, logprobs)
        if result.stop is not None:
            self._finish(req, "stop", matched=result.stop)
        elif n_out >= req.max_new_tokens or req.fill_len >= self.context_length:
            self._finish(req, "length")
        elif req.constraint is not None and not req.constraint.end_ids and req.constraint.is_complete():
            self._finish(req, "stop")  # complete, and no EOS to sample (ignore_eos)
        elif self.jump is not None and req.constraint is not None:
            self._draft(req)

    # ---- jump-forward ---------------------------------------------------------------------------
    def _draft(self, req: Req) -> None:
        """Appends the constraint's forced continuation as draft tokens, checked at the next step."""
        room = req.max_new_tokens - len(req.output_ids) - 1  # the step after the draft still samples
        tokens = self.jump.draft(req.constraint.forced_bytes())[:max(room, 0)]
        if tokens:
            req.output_ids.extend(tokens)
            req.num_draft = len(tokens)
            self.stats.jump_forward_drafted += len(tokens)

    def _drop_draft(self, req: Req, keep: int = 0) -> None:
        """Discards draft tokens after the first `keep`, with any KV computed for them."""
        if req.num_draft <= keep:
            return
        end = len(req.output_ids) - req.num_draft + keep
        if req.row is not None:
            self._truncate_kv(req, len(req.prompt_ids) + end)
        del req.output_ids[end:]
        req.num_draft = keep

    def _truncate_kv(self, req: Req, length: int) -> None:
        """Forgets the KV of positions >= length: owned slots go back to the allocator; tree-owned
        ones stay cached and are re-locked at the shallower node."""
        if req.kv_len <= length:
            return
        assert req.slot_len == req.kv_len, "no step may be in flight"
        self.allocator.free(self.req_to_token.read(req.row, max(length, req.cached_len), req.kv_len))
        if req.cached_len > length:
            match = self.cache.match_prefix(req.tokens(0, length))
            assert match.length == length, "a locked prefix must still be in the tree"
            self.cache.inc_lock_ref(match.node)
            self.cache.dec_lock_ref(req.last_node)
            req.last_node, req.cached_len = match.node, length
        req.kv_len = req.slot_len = length

    # ---- KV ownership -------------------------------------------------------------------------
    @property
    def cache_enabled(self) -> bool:
        return not self.cache.disable

    def _cache_progress(self, req: Req) -> None:
        """Hand the computed prefix to the tree so concurrent requests can share it now."""
        key = req.tokens(0, req.kv_len)
        slots = self.req_to_token.read(req.row, 0, req.kv_len)
        present = self.cache.insert(key, slots)
        self.allocator.free(slots[req.cached_len:present])
        match = self.cache.match_prefix(key)
        assert match.length == req.kv_len, "prefix just inserted must match in full"
        self.req_to_token.write(req.row, 0, match.slots)
        self.cache.inc_lock_ref(match.node)
        self.cache.dec_lock_ref(req.last_node)
        req.last_node, req.cached_len = match.node, req.kv_len

    def _release(self, req: Req, cache_computed: bool = True) -> None:
        """Give back the request's row and KV: computed tokens to the tree, the rest to the allocator."""
        if req.row is None:
            return
        slots = self.req_to_token.read(req.row, 0, req.slot_len)
        if cache_computed and self.cache_enabled and req.kv_len > req.cached_len:
            present = self.cache.insert(req.tokens(0, req.kv_len), slots[: req.kv_len])
            self.allocator.free(slots[req.cached_len:present])
            self.allocator.free(slots[req.kv_len:])
        else:
            self.allocator.free(slots[req.cached_len:])
        self.cache.dec_lock_ref(req.last_node)
        self.req_to_token.free_row(req.row)
        req.row, req.last_node = None, None
        req.kv_len = req.cached_len = req.slot_len = 0

    def _preempt(self, req: Req) -> None:
        self._drop_draft(req)  # the draft is re-proposed after the request resumes
        self.running.remove(req)
        self.stats.preemptions += 1
        req.num_preemptions += 1
        if self.cfg.preemption_mode == "swap" and req.kv_len > 0:
            kv_len = req.kv_len
            saved = self.pool.swap_out(self.req_to_token.read(req.row, 0, kv_len))
            self._release(req, cache_computed=False)
            req.swapped, req.kv_len = saved, kv_len
        else:
            self._release(req)
        req.state = ReqState.PREEMPTED
        self.waiting.insert(0, req)
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
        self._release(req)
        req.swapped = None
        req.state = ReqState.ABORTED if reason == "abort" else ReqState.FINISHED
        self.reqs.pop(req.rid, None)
        if reason == "abort":
            self.stats.aborted += 1
        else:
            self.stats.finished += 1
        tail = "" if isinstance(matched, str) else req.detok.flush()  # a stop string released its text
        self._emit_final(req, reason, matched, error, tail)

    def _emit(self, req: Req, text: str, token_ids: list[int], logprobs: list[TokenLogprob]) -> None:
        first = req.input_logprobs if req.return_logprob and len(req.output_ids) == 1 else None
        req.sink(StreamChunk(req.rid, text, token_ids, logprobs, prompt_tokens=len(req.prompt_ids),
                             cached_tokens=req.cached_tokens, completion_tokens=len(req.output_ids),
                             input_logprobs=first))

    def _emit_final(self, req: Req, reason: str, matched: int | str | None = None,
                    error: str | None = None, text: str = "") -> None:
        req.sink(StreamChunk(
            rid=req.rid, text=text, token_ids=[], logprobs=[], finished=True, finish_reason=reason,
            matched_stop=matched, error=error, prompt_tokens=len(req.prompt_ids),
            cached_tokens=req.cached_tokens, completion_tokens=len(req.output_ids),
            input_logprobs=req.input_logprobs if req.return_logprob and not req.output_ids else None,
        ))

    # ---- invariants -----------------------------------------------------------------------------
    def check_invariants(self) -> None:
        """free + in tree + held by live requests = every slot, each exactly once; locks match users."""
        self.cache.check()
        held, expected_locks = [], Counter()
        for req in self.running:
            assert req.row is not None, f"running request {req.rid} has no row"
            assert req.cached_len <= req.kv_len <= req.slot_len <= req.fill_len, f"bad lengths in {req.rid}"
            held.append(self.req_to_token.read(req.row, req.cached_len, req.slot_len))
            path = self.cache.path_slots(req.last_node)
            assert torch.equal(path, self.req_to_token.read(req.row, 0, req.cached_len)), \
                f"request {req.rid} does not use its locked prefix"
            node = req.last_node
            while node is not self.cache.root:
                expected_locks[id(node)] += 1
                node = node.parent
        for req in self.waiting:
            assert req.row is None and req.last_node is None, f"waiting request {req.rid} holds KV"
        for node in self.cache.nodes():
            assert node.lock_ref == expected_locks[id(node)], "tree lock_ref differs from live requests"
        parts = [self.allocator.free_slots(), self.cache.all_slots(), *held]
        counts = torch.bincount(torch.cat(parts).cpu(), minlength=self.pool.num_slots)
        assert counts.numel() == self.pool.num_slots, "slot index out of range"
        leaked = (counts == 0).nonzero().flatten().tolist()
        doubled = (counts > 1).nonzero().flatten().tolist()
        assert not leaked and not doubled, f"KV slots leaked {leaked[:8]} / double-owned {doubled[:8]}"
        rows = self.req_to_token.num_free_rows + len(self.running)
        assert rows == self.req_to_token.table.shape[0], "req_to_token row leaked"
