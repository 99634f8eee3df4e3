"""Flattens a step's scheduled chunks into tensors, runs the model, and picks the logits rows needed."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.backend import AttentionBackend, AttentionMetadata
from .memory import KVPool, ReqToToken
from .models.llama import ForwardContext, LlamaForCausalLM
from .request import Req


@dataclass(slots=True)
class ScheduledChunk:
    """Positions [start, start + length) of `req` get their KV computed this step."""

    req: Req
    start: int
    length: int

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def completes_fill(self) -> bool:
        return self.end == self.req.fill_len

    @property
    def samples(self) -> bool:
        return self.completes_fill and len(self.req.output_ids) < self.req.max_new_tokens

    @property
    def draft_positions(self) -> range:
        """Positions whose logits check the request's jump-forward draft (each predicts a draft token)."""
        if not self.samples or not self.req.num_draft:
            return range(0)
        last = self.end - 1
        assert self.start <= last - self.req.num_draft, "a draft is never split across chunks"
        return range(last - self.req.num_draft, last)

    def prompt_logit_positions(self) -> range:
        """Positions in this chunk whose logits score a prompt token the caller asked about."""
        if not self.req.wants_prompt_logprobs:
            return range(0)
        lo = max(self.start, self.req.next_prompt_logit)
        hi = min(self.end, len(self.req.prompt_ids) - 1)
        return range(lo, max(lo, hi))


@dataclass(slots=True)
class ChunkLogits:
    next_token: torch.Tensor | None  # [vocab] at the chunk's last position, when it samples
    draft: torch.Tensor | None  # [num_draft, vocab]: row j predicts the request's j-th draft token
    prompt: torch.Tensor | None  # [len(prompt_positions), vocab]
    prompt_positions: range


class ModelRunner:
    def __init__(self, model: LlamaForCausalLM, pool: KVPool, req_to_token: ReqToToken,
                 attn: AttentionBackend, device: torch.device):
        self.model = model
        self.pool = pool
        self.req_to_token = req_to_token
        self.attn = attn
        self.device = device

    @torch.inference_mode()
    def forward(self, chunks: list[ScheduledChunk]) -> list[ChunkLogits]:
        ids, positions, slots = [], [], []
        for c in chunks:
            ids.extend(c.req.tokens(c.start, c.end))
            positions.append(torch.arange(c.start, c.end))
            slots.append(self.req_to_token.read(c.req.row, c.start, c.end))
        meta = AttentionMetadata(
            req_to_token=self.req_to_token.table,
            req_pool_indices=torch.tensor([c.req.row for c in chunks], device=self.device),
            seq_lens=[c.end for c in chunks],
            extend_lens=[c.length for c in chunks],
            out_cache_loc=torch.cat(slots).to(self.device),
        )
        ctx = ForwardContext(self.attn, meta, self.pool.k_buffers, self.pool.v_buffers)
        input_ids = torch.tensor(ids, dtype=torch.int64, device=self.device)
        hidden = self.model(input_ids, torch.cat(positions).to(self.device), ctx)
        return self._select_logits(chunks, hidden)

    def _select_logits(self, chunks: list[ScheduledChunk], hidden: torch.Tensor) -> list[ChunkLogits]:
        rows: list[int] = []
        spans: list[tuple[int, int, int, int | None]] = []  # (first prompt row, count, first draft row, next row)
        offset = 0
        for c in chunks:
            prompt_pos = c.prompt_logit_positions()
            first = len(rows)
            rows.extend(offset + p - c.start for p in prompt_pos)
            first_draft = len(rows)
            rows.extend(offset + p - c.start for p in c.draft_positions)
            next_row = None
            if c.samples:
                next_row = len(rows)
                rows.append(offset + c.length - 1)
            spans.append((first, len(prompt_pos), first_draft, next_row))
            offset += c.length
        logits = self.model.compute_logits(hidden[torch.tensor(rows, dtype=torch.int64, device=self.device)]) \
            if rows else None
        out = []
        for c, (first, count, first_draft, next_row) in zip(chunks, spans):
            out.append(ChunkLogits(
                next_token=logits[next_row] if next_row is not None else None,
                draft=logits[first_draft:next_row] if c.draft_positions else None,
                prompt=logits[first:first + count] if count else None,
                prompt_positions=c.prompt_logit_positions(),
            ))
        return out
