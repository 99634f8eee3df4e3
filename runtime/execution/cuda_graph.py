"""Decode steps on fixed-shape static buffers, replayed as CUDA graphs.

A decode-only step of n requests runs at the smallest bucket b >= n (1, 2, 4, ... up to the largest
batch): its inputs reach the device in one copy into static buffers, padded with rows that write their
K/V to the pool's padding slot and whose logits are dropped. Positions, KV write slots and the attention
plan are computed on the device inside the graph, so a replay needs no host work beyond that copy.
Decodes that share a long radix prefix (cascade groups) run in a second graph per bucket, whose group
layout (members' order, each group's span and prefix length) the host packs into the same buffer; steps
without groups keep the plain graph. On CUDA each (bucket, cascade) forward is captured once and replayed;
with capture off (the CPU) the same padded forward runs eagerly, which lets the CPU tests check that
padding changes no real row.
"""
from __future__ import annotations

from bisect import bisect_left
from collections import Counter

import torch

from ...kernels.backend import AttentionBackend, DecodeBatch, DecodeGroups, pack_groups
from ..batch import StepBatch
from ..models.llama import ForwardContext, LlamaForCausalLM

IDS, ROWS, KV_LENS, REAL, ORDER, STARTS, SIZES, PREFIX_LENS = range(8)  # the rows of the packed input buffer
STEP_ROWS = REAL + 1  # IDS..REAL, what every step copies; a cascade step copies the group layout too
PACKED_ROWS = PREFIX_LENS + 1
MAX_GRAPH_GROUPS = 16  # cascade groups per step a graph holds (the prefix pass's grid grows with it)
WARMUP_RUNS = 2  # eager runs before a capture: Triton compiles, cuBLAS picks its kernels


def batch_buckets(max_batch: int) -> list[int]:
    """Powers of two below `max_batch`, then `max_batch` itself: 1, 2, 4, ..., max_batch."""
    if max_batch < 1:
        raise ValueError(f"the largest CUDA-graph batch must be >= 1, got {max_batch}")
    buckets, b = [], 1
    while b < max_batch:
        buckets.append(b)
        b *= 2
    return buckets + [max_batch]


def bucket_for(n: int, buckets: list[int]) -> int:
    """The smallest bucket that holds n sequences."""
    assert 1 <= n <= buckets[-1], f"{n} sequences do not fit the largest bucket {buckets[-1]}"
    return buckets[bisect_left(buckets, n)]


def pack_decode(input_ids: list[int], rows: list[int], kv_lens: list[int], bucket: int,
                out: torch.Tensor) -> None:
    """Writes one padded step into `out[:4, :bucket]` (int64 [>= 4, >= bucket]): token, req_to_token row,
    KV length with the new token, and 1 for a real sequence. Padding rows read row 0's first slot (any
    valid slot: their output is dropped) and write their own K/V to the padding slot."""
    n = len(input_ids)
    out[:STEP_ROWS, n:bucket] = torch.tensor([0, 0, 1, 0], dtype=torch.int64)[:, None]
    out[:STEP_ROWS, :n] = torch.tensor([input_ids, rows, kv_lens, [1] * n], dtype=torch.int64)


def max_groups(bucket: int) -> int:
    """Cascade groups a bucket's graph has room for: a group has at least two members, and past
    MAX_GRAPH_GROUPS the prefix pass's fixed grid would mostly launch programs that exit at once."""
    return min(bucket // 2, MAX_GRAPH_GROUPS)


def largest_groups(groups: list[tuple[list[int], int]], room: int) -> list[tuple[list[int], int]]:
    """The `room` groups whose shared prefix saves the most KV reads; the others' members attend over
    their whole KV (any subset of the groups is a valid cascade)."""
    if len(groups) <= room:
        return groups
    return sorted(groups, key=lambda g: (len(g[0]) - 1) * g[1], reverse=True)[:room]


def pack_cascade(groups: list[tuple[list[int], int]], bucket: int, out: torch.Tensor) -> None:
    """Writes a step's cascade layout (kernels.backend.DecodeGroups) into rows ORDER.. of `out`: the order
    of all `bucket` sequences (members group by group, then the rest, padding included) in
    out[ORDER, :bucket], then each group's start, size and prefix length, unused groups all 0."""
    members, starts, sizes, lens = pack_groups(groups)
    room = max_groups(bucket)
    assert len(starts) <= room, "more groups than the graph has room for"
    grouped = set(members)
    out[ORDER, :bucket] = torch.tensor(members + [i for i in range(bucket) if i not in grouped], dtype=torch.int64)
    pad = [0] * (room - len(starts))
    out[STARTS:, :room] = torch.tensor([starts + pad, sizes + pad, lens + pad], dtype=torch.int64)


class DecodeGraphs:
    """Runs decode-only steps padded to a bucket, through one captured graph per (bucket, cascade) when
    `capture`; cascade graphs exist when the attention backend reads shared prefixes once (and b >= 2)."""

    def __init__(self, model: LlamaForCausalLM, attn: AttentionBackend, req_to_token: torch.Tensor,
                 pad_slot: int, max_batch: int, capture: bool):
        self.model, self.attn, self.table, self.pad_slot = model, attn, req_to_token, pad_slot
        self.buckets = batch_buckets(max_batch)
        self.max_kv_len = req_to_token.shape[1]  # any request's KV fits its row
        self.cascade = attn.supports_cascade
        device = req_to_token.device
        self.inputs = torch.zeros(PACKED_ROWS, max_batch, dtype=torch.int64, device=device)
        self.host = torch.zeros(PACKED_ROWS, max_batch, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.graphs: dict[tuple[int, bool], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.steps: Counter[tuple[int, bool]] = Counter()  # padded steps run, by (bucket, cascade)
        if capture:
            self._capture_all()

    def fits(self, batch: StepBatch) -> bool:
        """Decode-only (one chain token per item) and no larger than the largest bucket."""
        items = batch.items
        return 0 < len(items) <= self.buckets[-1] and all(i.length == 1 and i.parents is None for i in items)

    def forward(self, batch: StepBatch, groups: list[tuple[list[int], int]] | None = None) -> torch.Tensor | None:
        """[len(batch.hidden_rows), vocab] float32 logits, or None when no row is wanted. `groups`: the
        step's cascade groups (batch.prefix_groups), which need a backend with cascade."""
        n = len(batch.items)
        b = bucket_for(n, self.buckets)
        pack_decode(batch.input_ids(), [i.row for i in batch.items], [i.end for i in batch.items], b, self.host)
        key = (b, bool(groups))
        copied = STEP_ROWS
        if groups:
            assert self.cascade, "cascade groups need an attention backend with cascade"
            pack_cascade(largest_groups(groups, max_groups(b)), b, self.host)
            copied = PACKED_ROWS
        self.inputs[:copied, :b].copy_(self.host[:copied, :b], non_blocking=True)
        self.steps[key] += 1
        if key in self.graphs:
            graph, logits = self.graphs[key]
            graph.replay()
        else:
            logits = self._padded_forward(*key)
        if not batch.hidden_rows:
            return None
        if batch.hidden_rows == list(range(n)):
            return logits[:n]
        return logits[torch.tensor(batch.hidden_rows, dtype=torch.int64, device=logits.device)]

    def _padded_forward(self, b: int, cascade: bool) -> torch.Tensor:
        """The step over the first b rows of the static inputs: device ops only, so it can be captured."""
        ids, rows, kv_lens, real = self.inputs[:STEP_ROWS, :b]
        positions = kv_lens - 1
        out_cache_loc = torch.where(real.bool(), self.table[rows, positions].long(), self.pad_slot)
        groups = None
        if cascade:
            starts, sizes, prefix_lens = self.inputs[STARTS:, :max_groups(b)]
            groups = DecodeGroups(self.inputs[ORDER, :b], starts, sizes, prefix_lens)
        self.attn.plan_decode(DecodeBatch(self.table, rows, kv_lens, out_cache_loc, self.max_kv_len, groups))
        hidden = self.model(ids, positions, ForwardContext(self.attn))
        return self.model.compute_logits(hidden)

    def _capture_all(self) -> None:
        """Largest bucket first (cascade, the larger workspace, before plain), all in one memory pool:
        smaller graphs reuse the larger ones' workspace."""
        pack_decode([], [], [], self.buckets[-1], self.inputs)  # padding only: writes reach the pad slot
        pack_cascade([], self.buckets[-1], self.inputs)  # no group: every prefix program exits at once
        keys = [(b, cascade) for b in reversed(self.buckets) for cascade in (True, False)
                if not cascade or (self.cascade and max_groups(b) > 0)]
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(stream):
            for key in keys:
                for _ in range(WARMUP_RUNS):
                    self._padded_forward(*key)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    logits = self._padded_forward(*key)
                pool = graph.pool()
                self.graphs[key] = (graph, logits)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
