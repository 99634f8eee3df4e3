"""How much one request may ask of the server: each limit is a `radixlang serve` flag, and a request
over one is refused with a 4xx that names it."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from ..runtime.config import option
from .errors import APIError


@dataclass(slots=True)
class ServerLimits:
    max_body_bytes: int = option(16 * 2**20, "bytes of a request body; a larger one gets a 413 before it is read")
    max_prompts: int = option(256, "prompts in one request")
    max_sequences: int = option(256, "prompts x n in one request (each is a request the engine runs)")
    max_program_states: int = option(1024, "states one /v1/programs run may hold: 1 + every fork's children")
    max_program_seconds: float = option(600.0, "wall time of one /v1/programs run; then it is cancelled")

    def validate(self) -> None:
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not value > 0:
                raise ValueError(f"{f.name} must be a number > 0, got {value!r}")

    def check_prompts(self, num_prompts: int, param: str) -> None:
        """Refuses a request with too many prompts (checked before they are tokenized)."""
        if num_prompts > self.max_prompts:
            raise APIError(400, f"{param} has {num_prompts} prompts; this server takes at most "
                                f"{self.max_prompts} per request (max_prompts)", param)

    def check_sequences(self, num_prompts: int, n: int) -> None:
        """Refuses a request with too many sequences (prompts x n; checked once built, before any runs)."""
        if num_prompts * n > self.max_sequences:
            raise APIError(400, f"{num_prompts} prompt(s) x n={n} is {num_prompts * n} sequences; this server "
                                f"takes at most {self.max_sequences} per request (max_sequences)", "n")

    def check_program_states(self, states: int) -> None:
        if states > self.max_program_states:
            raise APIError(400, f"the program creates {states} states (1 + the children of every fork); this "
                                f"server runs at most {self.max_program_states} per request (max_program_states)",
                           "program")

    def program_timeout_message(self) -> str:
        return (f"the program ran longer than this server's limit of {self.max_program_seconds:g} s per request "
                "(max_program_seconds) and was cancelled")
