"""One step of the engine, in one function: schedule, run the model, process the outputs, apply."""
from __future__ import annotations

import logging
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch

from ..batch import Finish, ScheduledItem, StepBatch
from ..constrained.jump_forward import JumpForwarder
from ..distributed.workers import WorkerFailure
from ..scheduling.scheduler import Scheduler
from ..speculative.drafter import Drafter
from .model_runner import ModelRunner
from .output_processor import OutputProcessor

logger = logging.getLogger(__name__)


@contextmanager
def aborting_on_error(batches: list[tuple[Scheduler, StepBatch]]) -> Iterator[None]:
    """A failed step must not take the engine down with it: its requests end with the error instead. A
    WorkerFailure passes: the model cannot run again, and the engine stops and fails every request."""
    try:
        yield
    except WorkerFailure:
        raise
    except Exception as e:
        logger.exception("step failed; aborting its %d request(s)", sum(len(b.items) for _, b in batches))
        for scheduler, batch in batches:
            scheduler.apply([Finish(item.req, "abort", error=f"internal error: {e!r}") for item in batch.items])


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
        with aborting_on_error([(self.scheduler, batch)]):
            self.complete(batch, self.runner.forward(batch))
        return batch.items

    def complete(self, batch: StepBatch, logits: torch.Tensor | None) -> None:
        """Samples the step's logits, streams, and ends the requests that are done."""
        result = self.outputs.process(batch, logits)
        self.scheduler.apply(result.finished)
        self.scheduler.apply(self.outputs.draft(result.to_draft))  # drafts see the ended requests gone

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
