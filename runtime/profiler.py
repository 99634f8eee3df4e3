"""torch.profiler over the engine's scheduler steps (SGLang's /start_profile, /stop_profile).

The profiler runs on the scheduler thread, where the model's forward runs: `start` and `stop` are called
there (Engine.start_profile / stop_profile), and so is `after_step`, which ends a run of `num_steps` steps
on its own. The trace is a Chrome trace, named as SGLang names its rank-0 trace:
`{output_dir}/{prefix}{profile_id}-TP-0.trace.json.gz` (open it in Perfetto or chrome://tracing).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from .validation import FieldError

logger = logging.getLogger(__name__)
DEFAULT_DIR_ENV = "SGLANG_TORCH_PROFILER_DIR"  # SGLang's: where traces go when no output_dir is given
ACTIVITIES = ("CPU", "GPU", "MEM")  # SGLang's names; MEM: tensor allocations too


@dataclass(frozen=True)
class ProfileSpec:
    output_dir: str | None = None  # default: $SGLANG_TORCH_PROFILER_DIR, else /tmp
    num_steps: int | None = None  # stop after this many scheduler steps that ran the model
    activities: tuple[str, ...] = ("CPU", "GPU")  # GPU: recorded where CUDA is available, else left out
    with_stack: bool = True
    record_shapes: bool = False
    profile_id: str | None = None  # default: the start time
    profile_prefix: str = ""

    def validate(self) -> None:
        unknown = [a for a in self.activities if a not in ACTIVITIES]
        if unknown:
            raise FieldError("activities", f"activities: {unknown} are not among {list(ACTIVITIES)} (RPD is ROCm's "
                                           "tracer)")
        if self.num_steps is not None and self.num_steps < 1:
            raise FieldError("num_steps", f"num_steps must be >= 1, got {self.num_steps}")


class StepProfiler:
    """At most one torch profiler run at a time; touched only on the scheduler thread."""

    def __init__(self) -> None:
        self._profile: torch.profiler.profile | None = None
        self._path: Path | None = None
        self._steps_left: int | None = None

    @property
    def running(self) -> bool:
        return self._profile is not None

    def start(self, spec: ProfileSpec) -> Path:
        """Starts recording; returns the path the trace will be written to."""
        if self.running:
            raise ValueError("profiling is already in progress; call /stop_profile first")
        spec.validate()
        folder = Path(spec.output_dir or os.environ.get(DEFAULT_DIR_ENV, "/tmp")).expanduser()
        folder.mkdir(parents=True, exist_ok=True)
        activities = [torch.profiler.ProfilerActivity.CPU] if "CPU" in spec.activities else []
        if "GPU" in spec.activities and torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
        if not activities:
            raise FieldError("activities", f"activities {list(spec.activities)}: nothing to record on this machine "
                                           "(no CUDA)")
        profile = torch.profiler.profile(activities=activities, with_stack=spec.with_stack,
                                         record_shapes=spec.record_shapes, profile_memory="MEM" in spec.activities)
        profile.start()
        self._profile, self._steps_left = profile, spec.num_steps
        self._path = folder / f"{spec.profile_prefix}{spec.profile_id or time.time()}-TP-0.trace.json.gz"
        return self._path

    def after_step(self, ran: bool) -> None:
        """Counts a scheduler step that ran the model; the last of `num_steps` stops the run."""
        if self._steps_left is None or not ran:
            return
        self._steps_left -= 1
        if self._steps_left <= 0:
            try:
                logger.info("profile written to %s", self.stop())
            except Exception:  # a trace that cannot be written must not fail the requests in flight
                logger.exception("writing the profile failed")

    def stop(self) -> Path:
        """Stops recording and writes the trace; returns its path."""
        if self._profile is None:
            raise ValueError("profiling is not in progress; call /start_profile first")
        profile, path = self._profile, self._path
        self._profile = self._path = self._steps_left = None
        assert path is not None, "`start` sets the path with the profile"
        profile.stop()
        profile.export_chrome_trace(str(path))
        return path
