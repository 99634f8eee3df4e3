"""How much one drafting context is drafted: a cost model that drafts only where verifies pay for
themselves, trees sized by what recent verifies accepted, and an exponential back-off with rare probes
where they do not, so that free text pays almost nothing. Shared by every drafter.

A verify pays when the tokens it accepts beyond the bonus token save more decode steps than the verify
and its drafting cost (`break_even`, in decode steps). While the moving average of accepted tokens is
below that, the context sits out 1, 3, 7, ... chances, at most `max_skip` (so probes spend about
SPEC_PROBE_SHARE of the time), and each probe refreshes the average; a probe that pays ends the back-off.
One record may pace many requests (a drafter's per match length, or per draft model): then a probe
makes the other requests wait too, so a back-off is not undone by a batch's worth of probes."""
from __future__ import annotations

import math
from dataclasses import dataclass

from ..config import SPEC_ACCEPT_EMA, SPEC_INITIAL_ACCEPT, SPEC_PROBE_SHARE


@dataclass(slots=True)
class Pacing:
    break_even: float  # tokens a verify must accept to pay for itself: verify overhead + drafting cost
    max_skip: int  # longest back-off, in chances to draft
    accepted: float = SPEC_INITIAL_ACCEPT  # moving average of tokens accepted per verify
    misses: int = 0  # verifies in a row that did not pay while the average did not either
    skip: int = 0  # chances still to sit out (back-off)

    @classmethod
    def for_cost(cls, break_even: float) -> Pacing:
        """A probe costs about `break_even` decode steps: sit out long enough that probes stay cheap."""
        return cls(break_even, max(1, math.ceil(break_even / SPEC_PROBE_SHARE)))

    def ready(self) -> bool:
        """Whether to draft now; a chance sat out counts down the back-off."""
        if self.skip > 0:
            self.skip -= 1
            return False
        if self.misses:  # a probe: the chances after it (other requests' too) wait for the next back-off
            self.skip = self._back_off(self.misses + 1)
        return True

    def budget(self, cap: int) -> int:
        """A tree about twice as big as what recent verifies accepted: each node costs verify compute."""
        return min(cap, 1 + int(2 * self.accepted))

    def verified(self, accepted: int) -> None:
        """After k verifies in a row that did not pay (nor did the average), sits out min(2^k - 1, max)."""
        self.accepted += SPEC_ACCEPT_EMA * (accepted - self.accepted)
        if accepted >= self.break_even or self.accepted >= self.break_even:
            self.misses = self.skip = 0
            return
        self.misses += 1
        self.skip = self._back_off(self.misses)

    def _back_off(self, misses: int) -> int:
        return min((1 << min(misses, 30)) - 1, self.max_skip)
