"""The n-gram drafter: per request, a trie over its own prompt and output; optionally a trie shared by
recent requests (repeated boilerplate across a program's calls). Trees are sized by what the request's
recent verifies accepted, and a request whose drafts keep failing is not drafted for a while (back-off),
so free text pays almost nothing."""
from __future__ import annotations

from dataclasses import dataclass

from ..config import SPEC_ACCEPT_EMA, SPEC_BACKOFF_MAX_STEPS, SPEC_INITIAL_ACCEPT, EngineConfig
from ..request import Req
from .ngram import NgramTrie
from .tree import DraftTree


@dataclass(slots=True)
class _ReqState:
    trie: NgramTrie
    fed: int = 0  # tokens of the request's sequence fed to its trie
    misses: int = 0  # verifies in a row that accepted nothing
    skip: int = 0  # steps still to sit out (back-off)
    accepted: float = SPEC_INITIAL_ACCEPT  # moving average of tokens accepted per verify


class NgramDrafter:
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

    def propose(self, req: Req, room: int) -> DraftTree:
        """A draft tree of at most `room` nodes (empty: none); the caller prunes it to the constraint."""
        state = self._reqs.get(req.rid)
        if state is None:
            state = self._reqs[req.rid] = _ReqState(NgramTrie(self.window))
        if state.skip > 0:
            state.skip -= 1
            return DraftTree([], [])
        state.trie.feed(req.tokens(state.fed, req.fill_len))
        state.fed = req.fill_len
        context = req.tokens(max(0, req.fill_len - self.max_match), req.fill_len)
        # a tree about twice as big as what recent verifies accepted: each node costs verify compute
        budget = min(self.budget, room, 1 + int(2 * state.accepted))
        args = (budget, self.min_match, self.max_match, self.max_breadth, self.max_depth)
        tree = state.trie.propose(context, *args)
        if not tree.tokens and self.shared is not None:
            tree = self.shared.propose(context, *args)
        return tree

    def verified(self, req: Req, drafted: int, accepted: int) -> None:
        """Sizes the next trees by what verifies accept; after k verifies in a row that kept nothing,
        sits out min(2^k, max) - 1 steps."""
        state = self._reqs.get(req.rid)
        if state is None or not drafted:
            return
        state.accepted += SPEC_ACCEPT_EMA * (accepted - state.accepted)
        if accepted:
            state.misses = 0
            return
        state.misses += 1
        state.skip = min(1 << state.misses, SPEC_BACKOFF_MAX_STEPS) - 1

    def forget(self, req: Req, finished: bool) -> None:
        """Drops the request's state; a finished request's sequence goes to the shared trie."""
        self._reqs.pop(req.rid, None)
        if not finished or self.shared is None:
            return
        if self.shared.size > self.capacity:
            self.shared.clear()  # recent requests only: start over rather than track ages
        self.shared.end_sequence()
        self.shared.feed(req.tokens(0, req.fill_len))
