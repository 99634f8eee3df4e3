"""One step of the engine, in one function: schedule, run the model, process the outputs, apply."""
from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from .batch import Finish, ScheduledItem
from .constrained.jump_forward import JumpForwarder
from .distributed.workers import WorkerFailure
from .model_runner import ModelRunner
from .output_processor import OutputProcessor
from .scheduler import Scheduler
from .speculative.drafter import Drafter

logger = logging.getLogger(__name__)


@dataclass
class EngineCore:
    """The scheduler (policy), the runner (the model) and the output processor (sampling, streaming),
    stepped together on the scheduler thread."""

    scheduler: Scheduler
    runner: ModelRunner
    outputs: OutputProcessor

    @torch.inference_mode()
    def step(self) -> list[ScheduledItem]:
        """Runs one batch; returns what it scheduled (nothing: no request could run)."""
        batch = self.scheduler.schedule()
        if batch is None:
            return []
        try:
            logits = self.runner.forward(batch)
            result = self.outputs.process(batch, logits)
            self.scheduler.apply(result.finished)
            self.scheduler.apply(self.outputs.draft(result.to_draft))  # drafts see the ended requests gone
        except WorkerFailure:  # the model cannot run again: the engine stops and fails every request
            raise
        except Exception as e:  # a failed step must not take the engine down with it
            logger.exception("step failed; aborting its %d request(s)", len(batch.items))
            self.scheduler.apply([Finish(item.req, "abort", error=f"internal error: {e!r}") for item in batch.items])
        return batch.items

    # ---- what the scheduler thread and the engine ask ---------------------------------------------
    @property
    def has_work(self) -> bool:
        return self.scheduler.has_work

    def abort_all(self, error: str | None = None) -> None:
        self.scheduler.abort_all(error)

    @property
    def jump(self) -> JumpForwarder | None:
        return self.outputs.jump

    @property
    def drafter(self) -> Drafter | None:
        return self.outputs.drafter  # the scheduler holds the same one, typed by what it asks of it

    def set_jump_forward(self, jump: JumpForwarder | None) -> None:
        self.outputs.jump = jump

    def set_drafter(self, drafter: Drafter | None) -> None:
        self.scheduler.drafter = self.outputs.drafter = drafter
