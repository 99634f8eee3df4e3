"""How much one request is drafted: trees sized by what its recent verifies accepted, and a back-off for a
request whose drafts keep failing, so that free text pays almost nothing. Shared by every drafter."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import SPEC_ACCEPT_EMA, SPEC_BACKOFF_MAX_STEPS, SPEC_INITIAL_ACCEPT


@dataclass(slots=True)
class Pacing:
    misses: int = 0  # verifies in a row that accepted nothing
    skip: int = 0  # steps still to sit out (back-off)
    accepted: float = SPEC_INITIAL_ACCEPT  # moving average of tokens accepted per verify

    def ready(self) -> bool:
        """Whether to draft this step; a step sat out counts down the back-off."""
        if self.skip > 0:
            self.skip -= 1
            return False
        return True

    def budget(self, cap: int) -> int:
        """A tree about twice as big as what recent verifies accepted: each node costs verify compute."""
        return min(cap, 1 + int(2 * self.accepted))

    def verified(self, accepted: int) -> None:
        """After k verifies in a row that kept nothing, sits out min(2^k, max) - 1 steps."""
        self.accepted += SPEC_ACCEPT_EMA * (accepted - self.accepted)
        if accepted:
            self.misses = 0
            return
        self.misses += 1
        self.skip = min(1 << self.misses, SPEC_BACKOFF_MAX_STEPS) - 1
