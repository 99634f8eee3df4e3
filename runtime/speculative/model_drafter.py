"""The draft-model drafter: a small model (or the target's first layers) expands, for every request at
once, a top-k tree by cumulative draft log-probability, one batched forward per tree level.

The draft model's KV lives in its own pool, owned by a second `KVManager` with its own radix cache, so a
prompt prefix is computed once for the draft too and every draft slot follows the same rules (and
`check`) as the target's. Each request has a `DraftSeq`: the verified tokens the draft has seen. A round
first catches up (the tokens verified since the last round, whose last row gives the root's children),
then feeds, per level, the tree so far (its frontier and their ancestors; a few tokens, recomputed rather
than kept, so the tree's slots go back right after each forward). Between rounds a sequence holds KV of
verified tokens only.

SELF keeps a separate pool rather than reading the target's first k layers of KV: the last verified (bonus)
token has no target KV yet when the draft runs, and one pool per model keeps each pool's slots owned by
one KV owner; the price is the catch-up forward, which the root's logits need anyway.

Trees are chosen deterministically (the top-k of the draft's distribution), so each proposed child has a
one-hot proposal probability, and the target's acceptance rule (`tree.accept_path`) stays exact."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import torch

from ...kernels.backend import AttentionBackend, AttentionBatch
from ...kernels.registry import create_backend
from ..config import SPEC_VERIFY_OVERHEAD, EngineConfig
from ..draft_tree import DraftTree, best_nodes, depths, subtree, with_ancestors
from ..kv.kv_manager import KVManager
from ..kv.memory import KVPool, ReqToToken, SlotAllocator
from ..kv.radix_cache import RadixCache
from ..models.llama import ForwardContext
from ..models.loading.loader import LoadedModel
from ..request import KVFields, Req
from .draft_model import DraftLM, EarlyExit, load_standalone, weights_per_token
from .pacing import Pacing


@dataclass(eq=False)
class DraftSeq(KVFields):
    """A request's tokens as the draft model's KV owner sees them (that owner never swaps them out)."""

    rid: str
    ids: list[int] = field(default_factory=list)

    @property
    def fill_len(self) -> int:
        return len(self.ids)

    @property
    def pending(self) -> int:
        return self.fill_len - self.kv_len

    def tokens(self, start: int, end: int) -> list[int]:
        return self.ids[start:end]


@dataclass(slots=True)
class _Round:
    """One request's tree being expanded: candidates (token, parent, cumulative log q) and the frontier."""

    index: int  # in the proposed batch
    seq: DraftSeq
    budget: int
    verified: int  # the sequence's verified length; tree nodes sit after it
    admitted: bool  # the sequence got its row this round: its catch-up is the prompt
    tokens: list[int] = field(default_factory=list)
    parents: list[int] = field(default_factory=list)
    scores: list[float] = field(default_factory=list)
    frontier: list[int] = field(default_factory=list)


class ModelDrafter:
    def __init__(self, cfg: EngineConfig, model: DraftLM, kv: KVManager, attn: AttentionBackend,
                 device: torch.device, draft_cost: float):
        """`draft_cost`: what one round of draft forwards costs, in target decode steps."""
        self.model, self.kv, self.attn, self.device = model, kv, attn, device
        # one record for all requests: how well a draft model agrees with its target is mostly a property
        # of the pair, so a new request starts from what earlier ones taught (and backed off if need be)
        self.pacing = Pacing.for_cost(SPEC_VERIFY_OVERHEAD + draft_cost)
        self.budget = cfg.speculative_num_draft_tokens
        self.steps = cfg.speculative_num_steps
        self.topk = cfg.speculative_eagle_topk
        self.max_catch_up = cfg.max_prefill_tokens  # tokens one draft forward computes, like a prefill chunk
        self._reqs: dict[str, DraftSeq] = {}

    # ---- the drafter protocol -----------------------------------------------------------------
    def propose(self, batch: list[tuple[Req, int]]) -> list[DraftTree]:
        trees = [DraftTree([], []) for _ in batch]
        rounds: list[_Round] = []
        catch_up = 0
        for i, (req, room) in enumerate(batch):
            seq = self._reqs.get(req.rid)
            if seq is None:
                seq = self._reqs[req.rid] = DraftSeq(req.rid, namespace=req.namespace)
            admitted = seq.row is None
            room_left = self.max_catch_up - catch_up if rounds else None  # the first round always runs
            if not self.pacing.ready() or not self._catch_up(seq, req, room_left):
                continue
            catch_up += seq.pending
            rounds.append(_Round(i, seq, self.pacing.budget(min(self.budget, room)), req.fill_len, admitted))
        if not rounds:
            return trees
        self._expand(rounds)
        for r in rounds:
            trees[r.index] = subtree(r.tokens, r.parents, best_nodes(r.scores, r.budget))
        return trees

    def verified(self, req: Req, drafted: int, accepted: int) -> None:
        if req.rid in self._reqs and drafted:
            self.pacing.verified(accepted)

    def forget(self, req: Req, finished: bool) -> None:
        """Releases the request's draft KV: its verified tokens go to the draft radix cache."""
        seq = self._reqs.pop(req.rid, None)
        if seq is not None:
            self.kv.release(seq)

    def flush(self) -> bool:
        """Evicts every draft prefix not in use; True when the draft cache is empty afterwards."""
        return self.kv.flush()

    def check(self, running: Iterable[Req]) -> None:
        """The draft pool's memory invariant, with the draft sequences of running requests as its users."""
        stale = set(self._reqs) - {r.rid for r in running}
        assert not stale, f"draft model holds state of requests not running: {sorted(stale)[:4]}"
        seqs = list(self._reqs.values())
        for seq in seqs:
            assert seq.slot_len == seq.kv_len, f"draft sequence {seq.rid} holds slots of a tree"
        self.kv.check([s for s in seqs if s.row is not None], [s for s in seqs if s.row is None])

    # ---- a round --------------------------------------------------------------------------------
    def _catch_up(self, seq: DraftSeq, req: Req, limit: int | None) -> bool:
        """Slots for the verified tokens the draft has not computed (False: no memory, or more than
        `limit` of them: no draft this step; the request catches up at a later one)."""
        seq.ids += req.tokens(seq.fill_len, req.fill_len)
        if seq.row is None:
            if self.kv.num_free_rows == 0:
                return False
            # the last token is recomputed for its logits; its radix prefix is locked before any eviction
            if self.kv.admit(seq, seq.fill_len - 1, seq.fill_len, self.kv.ensure_free) is None:
                return False
        assert seq.pending >= 1, "every round has at least the bonus token to catch up"
        if (limit is not None and seq.pending > limit) or not self.kv.ensure_free(seq.pending):
            return False
        self.kv.extend(seq, seq.pending)
        return True

    def _expand(self, rounds: list[_Round]) -> None:
        """Level 1 from the catch-up forward; then one forward per level over the trees so far."""
        logits = self._forward([(r.seq, r.seq.kv_len, None, [r.seq.pending - 1]) for r in rounds])
        for r in rounds:
            self.kv.computed(r.seq, r.seq.slot_len)
            if r.admitted:
                self.kv.commit(r.seq)  # concurrent requests with this prompt (n > 1) share its draft KV
        self._grow(rounds, logits, [[-1] for _ in rounds])
        for depth in range(1, self.steps):
            active = [r for r in rounds if r.frontier and depth < r.budget]
            nodes = [with_ancestors(r.parents, r.frontier) for r in active]
            if not active or not self.kv.ensure_free(sum(map(len, nodes))):
                return
            items: list[tuple[DraftSeq, int, list[int] | None, list[int]]] = []
            for r, ns in zip(active, nodes):
                tree = subtree(r.tokens, r.parents, ns)
                r.seq.ids += tree.tokens
                self.kv.extend(r.seq, len(ns))
                items.append((r.seq, r.verified, tree.parents, [ns.index(f) for f in r.frontier]))
            logits = self._forward(items)
            for r in active:  # the tree's KV is scratch: give its slots back at once
                self.kv.computed(r.seq, r.seq.slot_len)
                self.kv.truncate(r.seq, r.verified)
                del r.seq.ids[r.verified:]
            self._grow(active, logits, [r.frontier for r in active])

    def _grow(self, rounds: list[_Round], logits: torch.Tensor, expanded: list[list[int]]) -> None:
        """Adds the top-k children of each expanded node (rows of `logits`, in order); each round's next
        frontier is its top-k new children by cumulative log-probability."""
        logq = torch.log_softmax(logits.float(), dim=-1)
        top_values, top_ids = logq.topk(min(self.topk, logq.shape[-1]), dim=-1)
        values, ids = top_values.tolist(), top_ids.tolist()
        row = 0
        for r, parents in zip(rounds, expanded):
            new = []
            for parent in parents:
                base = r.scores[parent] if parent >= 0 else 0.0
                for token, lq in zip(ids[row], values[row]):
                    new.append(len(r.tokens))
                    r.tokens.append(token)
                    r.parents.append(parent)
                    r.scores.append(base + lq)
                row += 1
            r.frontier = sorted(new, key=lambda i: -r.scores[i])[: self.topk]

    def _forward(self, items: list[tuple[DraftSeq, int, list[int] | None, list[int]]]) -> torch.Tensor:
        """One draft forward: per item (sequence, first position, tree parents or None for a chain, rows
        wanted as offsets in the item), the new tokens being the sequence's slots from that position on.
        Returns the logits of the wanted rows, in order."""
        rows: list[int] = []
        input_ids: list[int] = []
        positions: list[int] = []
        hidden_rows: list[int] = []
        for seq, start, parents, wanted in items:
            n = seq.slot_len - start
            hidden_rows += [len(input_ids) + w for w in wanted]
            input_ids += seq.tokens(start, seq.slot_len)
            positions += list(range(start, start + n)) if parents is None else [start + d for d in depths(parents)]
            assert seq.row is not None, "a sequence in a forward has caught up, so holds a row"
            rows.append(seq.row)
        batch = AttentionBatch(
            req_to_token=self.kv.req_to_token.table, rows=rows, kv_lens=[s.slot_len for s, *_ in items],
            extend_lens=[s.slot_len - start for s, start, *_ in items], positions=positions,
            parents=[parents for _, _, parents, _ in items])
        plan = self.attn.plan(batch)
        ids = torch.tensor(input_ids, dtype=torch.int64, device=self.device)
        hidden = self.model(ids, plan.positions, ForwardContext(self.attn))
        return self.model.compute_logits(hidden[torch.tensor(hidden_rows, dtype=torch.int64, device=self.device)])


def build_model_drafter(cfg: EngineConfig, target: LoadedModel, pool_size: int, context_length: int) -> ModelDrafter:
    """The draft model (SELF or STANDALONE) with its own KV pool of `pool_size` tokens, table and cache."""
    device, dtype = cfg.torch_device(), cfg.torch_dtype()
    if cfg.speculative_algorithm == "SELF":
        model: DraftLM = EarlyExit(target.model, cfg.speculative_draft_layers)
        mcfg, layers = target.model.config, cfg.speculative_draft_layers
    else:
        assert cfg.speculative_draft_model is not None, "EngineConfig requires it with STANDALONE"
        model = load_standalone(cfg.speculative_draft_model, target, context_length, device, dtype)
        mcfg = model.config
        layers = mcfg.num_layers
    pool = KVPool(pool_size, layers, mcfg.num_kv_heads, mcfg.head_dim, dtype, device)
    allocator = SlotAllocator(pool_size, device)
    req_to_token = ReqToToken(cfg.max_running_requests, context_length, device)
    cache = RadixCache(allocator.free, disable=cfg.disable_radix_cache, device=device)
    attn = create_backend(cfg.attention_backend, pool.k_buffers, pool.v_buffers)
    # a round is one forward per tree level, each about the draft's share of a target decode step
    draft_cost = cfg.speculative_num_steps * weights_per_token(model) / weights_per_token(target.model)
    kv = KVManager(pool, allocator, req_to_token, cache)
    return ModelDrafter(cfg, model, kv, attn, device, draft_cost)
