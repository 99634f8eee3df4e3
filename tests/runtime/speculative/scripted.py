"""A base for test drafters that script one request's tree at a time and keep no state."""
from __future__ import annotations

from typing import Iterable

from radixlang.runtime.request import Req
from radixlang.runtime.speculative.tree import DraftTree


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
