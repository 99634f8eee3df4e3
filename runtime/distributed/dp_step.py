"""One rank's part of a DP-attention step, as every rank runs it (rank 0 in the engine process, the others
in their workers): its own requests' tokens through the whole model, the experts' all-to-alls joined with
every other rank, then its logits rows to rank 0, padded to the step's largest share so one gather carries
them.

A rank with no work runs an idle step: zero tokens, which still join each MoE layer's all-to-alls (the
collectives need every rank) and the logits gather.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ...kernels.backend import AttentionBatch
from ..execution.model_runner import ModelRunner, StepInputs
from ..models.llama import ForwardContext
from .group import TensorParallel


@dataclass(slots=True)
class DPStep:
    inputs: StepInputs  # this rank's own batch (zero tokens: idle)
    gather_rows: int  # logits rows each rank sends rank 0 (the most any rank has this step; 0: no gather)


def idle_inputs() -> StepInputs:
    """A step with no tokens, for a rank without work."""
    table = torch.zeros((0, 0), dtype=torch.int32)
    return StepInputs([], AttentionBatch(table, [], [], [], [], []), [])


class IdleAttention:
    """The attention of a step with no tokens: outputs of zero rows; no KV is read or written."""

    def forward(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, layer: int, scale: float) -> torch.Tensor:
        return q.new_empty(0, q.shape[1], v.shape[-1])

    def forward_latent(self, q_nope: torch.Tensor, q_rope: torch.Tensor, latent: torch.Tensor, layer: int,
                       scale: float, w_kv_b: torch.Tensor) -> torch.Tensor:
        return q_nope.new_empty(0, q_nope.shape[1], w_kv_b.shape[1] - q_nope.shape[-1])


def run_idle(runner: ModelRunner) -> None:
    """Every layer over zero rows: the rank joins each MoE layer's all-to-alls and touches no KV."""
    empty = torch.empty(0, dtype=torch.int64, device=runner.device)
    runner.model(empty, empty, ForwardContext(IdleAttention()))


def run_dp_step(runner: ModelRunner, tp: TensorParallel, step: DPStep) -> list[torch.Tensor]:
    """Runs this rank's share; on rank 0, every rank's logits [gather_rows, vocab] (padded), else []."""
    logits = None
    if step.inputs.input_ids:
        logits = runner.run(step.inputs)
    else:
        run_idle(runner)
    if step.gather_rows == 0:
        return []
    padded = torch.zeros(step.gather_rows, runner.model.config.vocab_size, device=runner.device)
    if logits is not None:
        padded[:logits.shape[0]] = logits
    return tp.gather(padded)
