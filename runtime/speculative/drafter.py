"""What a drafter is, the n-gram drafter, and the one place that builds the configured drafter.

The n-gram drafter keeps, per request, a trie over its own prompt and output; optionally a trie shared by
recent requests (repeated boilerplate across a program's calls). Every drafter paces its drafts
(`Pacing`): it drafts where verifies pay for themselves, sizes trees by what recent verifies accepted, and
backs off, probing rarely, where they do not."""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterable, Protocol

from ..config import SPEC_VERIFY_OVERHEAD, EngineConfig
from ..draft_tree import DraftTree
from ..request import Req
from .ngram import NgramTrie
from .pacing import Pacing

if TYPE_CHECKING:
    from ..models.loading.loader import LoadedModel


class Drafter(Protocol):
    def propose(self, batch: list[tuple[Req, int]]) -> list[DraftTree]:
        """For each (request, room): a draft tree of at most `room` nodes (empty: none), all requests at
        once (a draft model runs one batched forward per tree level); the caller prunes each tree to the
        request's stop tokens and constraint."""
        ...

    def verified(self, req: Req, drafted: int, accepted: int) -> None:
        """The target verified a tree of `drafted` nodes of this drafter's and kept `accepted`."""
        ...

    def forget(self, req: Req, finished: bool) -> None:
        """The request finished (finished=True), was aborted or preempted: drop what is held for it."""
        ...

    def flush(self) -> bool:
        """Drops what is cached for requests no longer running; True when nothing cached is left."""
        ...

    def check(self, running: Iterable[Req]) -> None:
        """Asserts the drafter holds state (and draft KV) for running requests only."""
        ...


def create_drafter(cfg: EngineConfig, target: LoadedModel, pool_size: int, context_length: int) -> Drafter | None:
    """The drafter `cfg.speculative_algorithm` names, or None (speculation off)."""
    if cfg.speculative_algorithm is None:
        return None
    if cfg.speculative_algorithm == "NGRAM":
        return NgramDrafter(cfg)
    from .model_drafter import build_model_drafter  # loads models and KV memory: torch-heavy

    return build_model_drafter(cfg, target, pool_size, context_length)


@dataclass(slots=True)
class _ReqState:
    trie: NgramTrie
    fed: int = 0  # tokens of the request's sequence fed to its trie
    drafted_from: tuple[bool, int] | None = None  # (shared trie?, match length) of its last draft


class NgramDrafter:
    """Paces by match: verifies are scored per (trie, matched suffix length), shared by all requests, since
    how often a match's continuation is right depends on its length (free text mostly matches one or two
    tokens and is rarely continued; quoted text matches long suffixes and is); one or two verifies of a
    kind then teach every request whether it pays."""

    def __init__(self, cfg: EngineConfig):
        self.budget = cfg.speculative_num_draft_tokens
        self.min_match = cfg.speculative_ngram_min_match_window_size
        self.max_match = cfg.speculative_ngram_max_match_window_size
        self.max_breadth = cfg.speculative_ngram_max_bfs_breadth
        self.max_depth = cfg.speculative_ngram_branch_length
        self.window = self.max_match + self.max_depth
        self.capacity = cfg.speculative_ngram_capacity
        self.shared = NgramTrie(self.window) if self.capacity > 0 else None
        self._reqs: dict[str, _ReqState] = {}
        self._pacing: dict[tuple[bool, int], Pacing] = {}  # (shared trie?, match length) -> its record

    def propose(self, batch: list[tuple[Req, int]]) -> list[DraftTree]:
        return [self.propose_one(req, room) for req, room in batch]

    def propose_one(self, req: Req, room: int) -> DraftTree:
        state = self._reqs.get(req.rid)
        if state is None:
            state = self._reqs[req.rid] = _ReqState(NgramTrie(self.window))
        state.trie.feed(req.tokens(state.fed, req.fill_len))
        state.fed = req.fill_len
        state.drafted_from = None
        context = req.tokens(max(0, req.fill_len - self.max_match), req.fill_len)
        found, shared = state.trie.match(context, self.min_match, self.max_match), False
        if found is None and self.shared is not None:
            found, shared = self.shared.match(context, self.min_match, self.max_match), True
        if found is None:
            return DraftTree([], [])
        key = (shared, found.length)
        pacing = self._pacing.get(key)
        if pacing is None:
            pacing = self._pacing[key] = Pacing.for_cost(SPEC_VERIFY_OVERHEAD)  # a trie lookup costs ~nothing
        if not pacing.ready():
            return DraftTree([], [])
        state.drafted_from = key
        return NgramTrie.expand(found, pacing.budget(min(self.budget, room)), self.max_breadth, self.max_depth)

    def verified(self, req: Req, drafted: int, accepted: int) -> None:
        state = self._reqs.get(req.rid)
        if state is not None and drafted and state.drafted_from is not None:
            self._pacing[state.drafted_from].verified(accepted)

    def forget(self, req: Req, finished: bool) -> None:
        """Drops the request's state; a finished request's sequence goes to the shared trie."""
        self._reqs.pop(req.rid, None)
        if not finished or self.shared is None:
            return
        if self.shared.size > self.capacity:
            self.shared.clear()  # recent requests only: start over rather than track ages
        self.shared.end_sequence()
        self.shared.feed(req.tokens(0, req.fill_len))

    def flush(self) -> bool:
        """Forgets recent requests: the shared trie is a cache of their text."""
        if self.shared is not None:
            self.shared.clear()
        return True

    def check(self, running: Iterable[Req]) -> None:
        stale = set(self._reqs) - {r.rid for r in running}
        assert not stale, f"n-gram drafter holds state of requests not running: {sorted(stale)[:4]}"
