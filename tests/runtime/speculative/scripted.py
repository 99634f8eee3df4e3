"""A base for test drafters that script one request's tree at a time and keep no state, and a way to make
a draft model draft at every step."""
from __future__ import annotations

from typing import Iterable

from radixlang.runtime.draft_tree import DraftTree
from radixlang.runtime.request import Req
from radixlang.runtime.speculative.pacing import Pacing


class ScriptedDrafter:
    def propose_one(self, req: Req, room: int) -> DraftTree:
        raise NotImplementedError

    def propose(self, batch: list[tuple[Req, int]]) -> list[DraftTree]:
        return [self.propose_one(req, room) for req, room in batch]

    def verified(self, req: Req, drafted: int, accepted: int) -> None:
        pass

    def forget(self, req: Req, finished: bool) -> None:
        pass

    def flush(self) -> bool:
        return True

    def check(self, running: Iterable[Req]) -> None:
        pass


def draft_every_step(drafter) -> None:
    """Pins a draft model's pacing to draft at every chance whatever verifies accept: correctness tests
    want many verifies, not the few probes that a tiny model's costly drafts would earn."""
    drafter.pacing = Pacing(break_even=0.0, max_skip=0)
