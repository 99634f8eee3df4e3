"""DP attention's step: every rank's scheduler picks its own batch, then all ranks run the model together
(the experts' all-to-alls need every rank, so a rank without work runs an empty batch), and each rank's
output processor samples its own logits rows and ends its own requests."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..batch import ScheduledItem
from ..constrained.jump_forward import JumpForwarder
from ..distributed.dp_runner import DPRunner
from ..scheduling.dp_scheduler import DPScheduler
from .engine_core import EngineCore, aborting_on_error


@dataclass
class DPEngineCore:
    """`ranks[r]`: DP rank r's scheduler and output processor (its runner: the shared `runner`)."""

    ranks: list[EngineCore]
    runner: DPRunner

    def __post_init__(self) -> None:
        self.scheduler = DPScheduler([core.scheduler for core in self.ranks])

    @torch.inference_mode()
    def step(self) -> list[ScheduledItem]:
        """One step of every rank, in lockstep; returns what all of them scheduled (nothing: no rank could
        run, and no rank runs: the workers wait for the next step)."""
        batches = [core.scheduler.schedule() for core in self.ranks]
        scheduled = [(core, batch) for core, batch in zip(self.ranks, batches) if batch is not None]
        if not scheduled:
            return []
        logits: list[torch.Tensor | None] | None = None
        with aborting_on_error([(core.scheduler, batch) for core, batch in scheduled]):
            logits = self.runner.forward_ranks(batches)
        for core, batch, rows in zip(self.ranks, batches, logits or []):
            if batch is not None:
                with aborting_on_error([(core.scheduler, batch)]):  # one rank's failure ends only its requests
                    core.complete(batch, rows)
        return [item for _, batch in scheduled for item in batch.items]

    # ---- what the scheduler thread and the engine ask ---------------------------------------------
    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def abort_all(self, error: str | None = None) -> None:
        self.scheduler.abort_all(error)

    def set_jump_forward(self, jump: JumpForwarder | None) -> None:
        for core in self.ranks:
            core.set_jump_forward(jump)
