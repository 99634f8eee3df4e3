"""Rank 0's model runner under DP attention: each rank runs the batch of its own scheduler over its own KV
pool, all in one step. Rank 0's pool is here; the others' live in their workers, and their KV owners'
position -> slot tables here say where each token sits, so each worker gets its rows of its own table."""
from __future__ import annotations

import torch

from ...kernels.backend import AttentionBackend
from ..batch import StepBatch, prefix_groups
from ..execution.model_runner import ModelRunner, StepInputs
from ..kv.memory import ReqToToken
from ..models.llama import LlamaForCausalLM
from .dp_step import DPStep, idle_inputs, run_dp_step
from .runner import TPRunner
from .worker import host_step
from .workers import TPWorkers


class DPRunner(TPRunner):
    """`tables[r]`: DP rank r's request table (rank 0's is the runner's own `req_to_token`)."""

    def __init__(self, model: LlamaForCausalLM, tables: list[ReqToToken], attn: AttentionBackend,
                 device: torch.device, workers: TPWorkers):
        super().__init__(model, tables[0], attn, device, workers)
        self.tables = tables

    def forward_ranks(self, batches: list[StepBatch | None]) -> list[torch.Tensor | None]:
        """Each rank's batch (None: it idles, joining the collectives with zero tokens) -> its logits rows
        (None where none are wanted)."""
        inputs = [idle_inputs() if b is None else self._inputs(b, t.table) for b, t in zip(batches, self.tables)]
        rows = [len(i.hidden_rows) for i in inputs]
        gather = max(rows)
        self.workers.send_dp_steps([DPStep(host_step(i) if i.input_ids else i, gather) for i in inputs[1:]])
        try:
            parts = run_dp_step(self, self.workers.tp, DPStep(inputs[0], gather))
        except Exception as e:  # noqa: BLE001 - once rank 0 leaves a step midway the ranks are out of step
            raise self.workers.fail(e) from e
        if not parts:
            return [None] * len(rows)
        return [part[:n] if n else None for part, n in zip(parts, rows)]

    def forward(self, batch: StepBatch) -> torch.Tensor | None:
        """Rank 0's batch alone (the other ranks idle)."""
        return self.forward_ranks([batch] + [None] * (len(self.tables) - 1))[0]

    def expert_load(self) -> torch.Tensor:
        """Every rank's routing counts summed: each rank's routers see only its own requests' tokens."""
        return torch.stack([super().expert_load(), *self.workers.expert_loads()]).sum(dim=0)

    def run(self, inputs: StepInputs) -> torch.Tensor | None:
        """Rank 0's own inputs: the workers got theirs from `forward_ranks`."""
        return ModelRunner.run(self, inputs)

    def _inputs(self, batch: StepBatch, table: torch.Tensor) -> StepInputs:
        groups = [] if self.cascade_min is None else prefix_groups(batch.items, self.cascade_min)
        return StepInputs(batch.input_ids(), batch.attention_batch(table, groups), batch.hidden_rows)
