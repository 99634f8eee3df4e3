"""Runs one step's batch: plans attention once, runs the model, and computes the logits rows needed."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..kernels.backend import AttentionBackend, AttentionBatch
from .batch import StepBatch
from .config import CASCADE_MIN_PREFIX
from .memory import ReqToToken
from .models.llama import ForwardContext, LlamaForCausalLM


@dataclass(slots=True)
class StepInputs:
    """All the model needs for one step, free of request objects (tensor-parallel ranks receive it)."""

    input_ids: list[int]
    attention: AttentionBatch
    hidden_rows: list[int]  # for each logits row, its token's index in the step


class ModelRunner:
    """`req_to_token`: None on a tensor-parallel worker rank, whose steps arrive as StepInputs."""

    def __init__(self, model: LlamaForCausalLM, req_to_token: ReqToToken | None, attn: AttentionBackend,
                 device: torch.device):
        self.model = model
        self.req_to_token = req_to_token
        self.attn = attn
        self.device = device

    def forward(self, batch: StepBatch) -> torch.Tensor | None:
        """[len(batch.hidden_rows), vocab] float32 logits, or None when no row is wanted."""
        return self.run(self.step_inputs(batch))

    def step_inputs(self, batch: StepBatch) -> StepInputs:
        cascade_min = CASCADE_MIN_PREFIX if self.attn.supports_cascade else None
        return StepInputs(batch.input_ids(), batch.attention_batch(self.req_to_token.table, cascade_min),
                          batch.hidden_rows)

    def run(self, inputs: StepInputs) -> torch.Tensor | None:
        plan = self.attn.plan(inputs.attention)
        input_ids = torch.tensor(inputs.input_ids, dtype=torch.int64, device=self.device)
        hidden = self.model(input_ids, plan.positions, ForwardContext(self.attn))
        rows = inputs.hidden_rows
        if not rows:
            return None
        if len(rows) < hidden.shape[0]:
            hidden = hidden[torch.tensor(rows, dtype=torch.int64, device=self.device)]
        return self.model.compute_logits(hidden)

    def close(self) -> None:
        """Releases what the runner started (tensor-parallel worker ranks); nothing here."""
