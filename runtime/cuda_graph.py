"""Decode steps on fixed-shape static buffers, replayed as CUDA graphs.

A decode-only step of n requests runs at the smallest bucket b >= n (1, 2, 4, ... up to the largest
batch): its inputs reach the device in one copy into static buffers, padded with rows that write their
K/V to the pool's padding slot and whose logits are dropped. Positions, KV write slots and the attention
plan are computed on the device inside the graph, so a replay needs no host work beyond that copy.
On CUDA each bucket's forward is captured once and replayed; with capture off (the CPU) the same padded
forward runs eagerly, which lets the CPU tests check that padding changes no real row.
"""
from __future__ import annotations

from bisect import bisect_left

import torch

from ..kernels.backend import AttentionBackend, DecodeBatch
from .batch import StepBatch
from .models.llama import ForwardContext, LlamaForCausalLM

IDS, ROWS, KV_LENS, REAL = range(4)  # the rows of the packed input buffer
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
    """Writes one padded step into `out[:, :bucket]` (int64 [4, >= bucket]): token, req_to_token row, KV
    length with the new token, and 1 for a real sequence. Padding rows read row 0's first slot (any valid
    slot: their output is dropped) and write their own K/V to the padding slot."""
    n = len(input_ids)
    out[:, n:bucket] = torch.tensor([0, 0, 1, 0], dtype=torch.int64)[:, None]
    out[:, :n] = torch.tensor([input_ids, rows, kv_lens, [1] * n], dtype=torch.int64)


class DecodeGraphs:
    """Runs decode-only steps padded to a bucket, through one captured graph per bucket when `capture`."""

    def __init__(self, model: LlamaForCausalLM, attn: AttentionBackend, req_to_token: torch.Tensor,
                 pad_slot: int, max_batch: int, capture: bool):
        self.model, self.attn, self.table, self.pad_slot = model, attn, req_to_token, pad_slot
        self.buckets = batch_buckets(max_batch)
        self.max_kv_len = req_to_token.shape[1]  # any request's KV fits its row
        device = req_to_token.device
        self.inputs = torch.zeros(4, max_batch, dtype=torch.int64, device=device)
        self.host = torch.zeros(4, max_batch, dtype=torch.int64, pin_memory=device.type == "cuda")
        self.graphs: dict[int, tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        if capture:
            self._capture_all()

    def fits(self, batch: StepBatch) -> bool:
        """Decode-only (one chain token per item) and no larger than the largest bucket."""
        items = batch.items
        return 0 < len(items) <= self.buckets[-1] and all(i.length == 1 and i.parents is None for i in items)

    def forward(self, batch: StepBatch) -> torch.Tensor | None:
        """[len(batch.hidden_rows), vocab] float32 logits, or None when no row is wanted."""
        n = len(batch.items)
        b = bucket_for(n, self.buckets)
        pack_decode(batch.input_ids(), [i.req.row for i in batch.items], [i.end for i in batch.items], b, self.host)
        self.inputs[:, :b].copy_(self.host[:, :b], non_blocking=True)
        if b in self.graphs:
            graph, logits = self.graphs[b]
            graph.replay()
        else:
            logits = self._padded_forward(b)
        if not batch.hidden_rows:
            return None
        if batch.hidden_rows == list(range(n)):
            return logits[:n]
        return logits[torch.tensor(batch.hidden_rows, dtype=torch.int64, device=logits.device)]

    def _padded_forward(self, b: int) -> torch.Tensor:
        """The step over the first b rows of the static inputs: device ops only, so it can be captured."""
        ids, rows, kv_lens, real = self.inputs[:, :b]
        positions = kv_lens - 1
        out_cache_loc = torch.where(real.bool(), self.table[rows, positions].long(), self.pad_slot)
        self.attn.plan_decode(DecodeBatch(self.table, rows, kv_lens, out_cache_loc, self.max_kv_len))
        hidden = self.model(ids, positions, ForwardContext(self.attn))
        return self.model.compute_logits(hidden)

    def _capture_all(self) -> None:
        """Largest bucket first, all in one memory pool: smaller graphs reuse the larger ones' workspace."""
        pack_decode([], [], [], self.buckets[-1], self.inputs)  # padding only: writes reach the pad slot
        pool = None
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.inference_mode(), torch.cuda.stream(stream):
            for b in reversed(self.buckets):
                for _ in range(WARMUP_RUNS):
                    self._padded_forward(b)
                graph = torch.cuda.CUDAGraph()
                with torch.cuda.graph(graph, pool=pool, stream=stream):
                    logits = self._padded_forward(b)
                pool = graph.pool()
                self.graphs[b] = (graph, logits)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
