"""The attention-backend contract: `plan` once per step, then `forward` once per layer.

The runtime describes a step as an `AttentionBatch` (host lists and the position->slot table) and owns
the KV buffers, which a backend receives when it is built; kernels never import the runtime.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import accumulate
from typing import Protocol

import torch


@dataclass(slots=True)
class AttentionBatch:
    """One step: sequence i appends `extend_lens[i]` new tokens to its KV, which then holds `kv_lens[i]`
    tokens; the new tokens' K/V go to the last `extend_lens[i]` entries of row `rows[i]` of `req_to_token`.

    A sequence's new tokens are a chain (each sees all earlier ones) unless `parents[i]` is given: then
    new token j sees the cached prefix, itself and its ancestors, where `parents[i][j]` is the index of
    its parent among the new tokens (-1: the cached prefix). A token's parent always comes before it.
    """

    req_to_token: torch.Tensor  # [max_reqs, max_context] int32: position -> KV slot
    rows: list[int]
    kv_lens: list[int]  # includes the new tokens
    extend_lens: list[int]
    positions: list[int]  # rope position of every new token, sequences concatenated
    parents: list[list[int] | None]
    # cascade: groups of single-token sequences whose KV starts with the same `length` slots (a shared
    # radix prefix), so a backend may read that prefix once per group; a sequence is in at most one group
    prefix_groups: list[tuple[list[int], int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return len(self.positions)


@dataclass(slots=True)
class AttentionPlan:
    """Device index tensors shared by every layer of one step (FlashInfer's layout)."""

    qo_indptr: torch.Tensor  # [batch + 1] int64: sequence i's queries are rows qo_indptr[i]:qo_indptr[i+1]
    kv_indptr: torch.Tensor  # [batch + 1] int64
    kv_indices: torch.Tensor  # [sum(kv_lens)] int64: every sequence's KV slots, in position order
    out_cache_loc: torch.Tensor  # [num_tokens] int64: where each new token's K/V is written
    positions: torch.Tensor  # [num_tokens] int64
    max_q_len: int
    max_kv_len: int


@dataclass(slots=True)
class DecodeGroups:
    """A fixed-shape decode step's cascade groups, as device tensors (CUDA graphs: the host packs them into
    static buffers before a replay). Cascade position p holds sequence order[p]: each group's members are
    contiguous, then every other sequence (ungrouped and padding). Group j is positions
    [starts[j], starts[j] + sizes[j]), whose KV share their first prefix_lens[j] entries; size 0: unused."""

    order: torch.Tensor  # [b] int64, a permutation of the sequences
    starts: torch.Tensor  # [g] int64
    sizes: torch.Tensor  # [g] int64
    prefix_lens: torch.Tensor  # [g] int64


def pack_groups(groups: list[tuple[list[int], int]]) -> tuple[list[int], list[int], list[int], list[int]]:
    """Host lists of the cascade layout: (members group by group, each group's start among them, its size,
    its prefix length)."""
    members: list[int] = []
    starts: list[int] = []
    sizes: list[int] = []
    lens: list[int] = []
    for group, length in groups:
        starts.append(len(members))
        sizes.append(len(group))
        lens.append(length)
        members.extend(group)
    return members, starts, sizes, lens


@dataclass(slots=True)
class DecodeBatch:
    """A decode-only step of fixed shape (CUDA graphs): one new token for each of `rows.numel()` sequences,
    all given as device tensors, so planning needs no host data and can be captured and replayed.
    Padding sequences (a batch filled up to its graph's size) are ordinary rows whose token is dropped."""

    req_to_token: torch.Tensor  # [max_reqs, max_context] int32: position -> KV slot
    rows: torch.Tensor  # [b] int64: each sequence's req_to_token row
    kv_lens: torch.Tensor  # [b] int64, >= 1: KV length including the new token
    out_cache_loc: torch.Tensor  # [b] int64: where each new token's K/V is written
    max_kv_len: int  # a bound on kv_lens fixed at capture: sizes the gathers and the split count
    groups: DecodeGroups | None = None  # cascade groups (a backend without cascade attends over the full KV)


def offsets(lens: list[int]) -> list[int]:
    """[0, lens[0], lens[0] + lens[1], ...]: where each sequence's run starts in a flat layout."""
    return [0, *accumulate(lens)]


FEW_RUNS = 8  # up to this many runs of a table, slicing each costs less than one vectorized gather/scatter


def build_plan(batch: AttentionBatch, device: torch.device) -> AttentionPlan:
    """Gathers each sequence's KV slots out of req_to_token into one flat index tensor: a slice per sequence
    for a few, else in a fixed number of tensor ops whatever the batch size."""
    q_ptr, kv_ptr = offsets(batch.extend_lens), offsets(batch.kv_lens)
    if len(batch.rows) <= FEW_RUNS:
        table = batch.req_to_token
        kv_indices = torch.cat([table[row, :total] for row, total in zip(batch.rows, batch.kv_lens)])
        out_cache_loc = torch.cat([table[row, total - n:total]
                                   for row, total, n in zip(batch.rows, batch.kv_lens, batch.extend_lens)])
    else:
        kv_indices, out_cache_loc = _gather_slots(batch, q_ptr, kv_ptr)
    return AttentionPlan(
        qo_indptr=torch.tensor(q_ptr, dtype=torch.int64, device=device),
        kv_indptr=torch.tensor(kv_ptr, dtype=torch.int64, device=device),
        kv_indices=kv_indices.to(device, torch.int64),
        out_cache_loc=out_cache_loc.to(device, torch.int64),
        positions=torch.tensor(batch.positions, dtype=torch.int64, device=device),
        max_q_len=max(batch.extend_lens),
        max_kv_len=max(batch.kv_lens),
    )


def _gather_slots(batch: AttentionBatch, q_ptr: list[int], kv_ptr: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """(kv_indices, out_cache_loc) as two gathers from the flattened table; the host lists reach the
    table's device in one copy."""
    table = batch.req_to_token
    width = table.shape[1]
    host = torch.tensor([batch.rows, batch.kv_lens, batch.extend_lens, kv_ptr[:-1], q_ptr[:-1]], dtype=torch.int64)
    rows, kv_lens, extend_lens, kv_first, q_first = host.to(table.device, non_blocking=True)
    flat = table.view(-1)
    # entry j of the flat run of sequence i sits at table[rows[i], j - first[i] + start[i]]
    kv_at = flat_runs(rows * width - kv_first, kv_lens, kv_ptr[-1])
    new_at = flat_runs(rows * width + kv_lens - extend_lens - q_first, extend_lens, q_ptr[-1])
    return flat.index_select(0, kv_at), flat.index_select(0, new_at)


def flat_runs(base: torch.Tensor, lens: torch.Tensor, total: int) -> torch.Tensor:
    """base[i] + j for each position j of the flat layout that run i (lens[i] long) covers: [total] int64
    (total == lens.sum(), given so that no device value is read back). With base[i] = row_i * width +
    start_i - (where run i starts in the flat layout), the runs' places in a flattened [rows, width] table."""
    # output_size spares a CUDA device sync; torch's CPU kernel runs far slower with it than without
    repeated = base.repeat_interleave(lens, output_size=total if lens.is_cuda else None)
    return repeated + torch.arange(total, device=lens.device)


def tree_visibility(parents: list[int]) -> torch.Tensor:
    """[n, n] bool: new token j sees new token i when i is j or one of j's ancestors."""
    n = len(parents)
    seen = torch.eye(n, dtype=torch.bool)
    for j, p in enumerate(parents):
        assert p < j, "a token's parent comes before it"
        if p >= 0:
            seen[j] |= seen[p]
    return seen


class AttentionBackend(Protocol):
    """Built over the per-layer KV buffers ([num_slots, num_kv_heads, head_dim] each)."""

    supports_cascade: bool  # whether `plan` uses AttentionBatch.prefix_groups (else they need not be found)

    def plan(self, batch: AttentionBatch) -> AttentionPlan:
        """Builds this step's index tensors; `forward` uses them until the next `plan`."""
        ...

    def plan_decode(self, batch: DecodeBatch) -> None:
        """Plans a fixed-shape decode step with device ops only (no host sync: it can run inside a CUDA
        graph); `forward` then uses it until the next plan."""
        ...

    def forward(
        self,
        q: torch.Tensor,  # [num_tokens, num_heads, head_dim]
        k: torch.Tensor,  # [num_tokens, num_kv_heads, head_dim]
        v: torch.Tensor,
        layer: int,
        scale: float,
    ) -> torch.Tensor:  # [num_tokens, num_heads, head_dim]
        """Writes k/v into layer `layer`'s cache at the plan's slots, then attends over each KV."""
        ...

    def forward_latent(
        self,
        q_nope: torch.Tensor,  # [num_tokens, num_heads, qk_nope_head_dim]
        q_rope: torch.Tensor,  # [num_tokens, num_heads, qk_rope_head_dim], rotated
        latent: torch.Tensor,  # [num_tokens, 1, kv_lora_rank + qk_rope_head_dim]: each token's cached row
        layer: int,
        scale: float,
        w_kv_b: torch.Tensor,  # [num_heads, qk_nope_head_dim + v_head_dim, kv_lora_rank]
    ) -> torch.Tensor:  # [num_tokens, num_heads, v_head_dim]
        """MLA over a latent pool (K and V buffers one tensor): writes `latent` at the plan's slots, then
        attends, extends with K and V up-projected from the latents, decodes absorbed (kernels/mla.py)."""
        ...
