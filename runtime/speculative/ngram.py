"""An n-gram trie: counts every run of up to `window` tokens of the sequences fed to it, and proposes a
draft tree from the continuations of the longest suffix of a context it has seen before."""
from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Iterable, NamedTuple

from ..draft_tree import DraftTree


@dataclass(slots=True)
class _Node:
    count: int = 0
    children: dict[int, "_Node"] = field(default_factory=dict)


class Match(NamedTuple):
    node: _Node  # the trie node of the matched suffix: its children continue it
    length: int  # tokens matched: longer matches are drafted with more confidence


class NgramTrie:
    def __init__(self, window: int):
        assert window >= 2
        self.window = window
        self.root = _Node()
        self.size = 0  # nodes, the root excluded
        self._open: list[_Node] = []  # where the runs that started in the last window - 1 tokens end

    def feed(self, tokens: Iterable[int]) -> None:
        """Extends the current sequence by `tokens`: every run ending at each of them is counted once."""
        for token in tokens:
            grown = []
            for node in self._open + [self.root]:
                child = node.children.get(token)
                if child is None:
                    child = node.children[token] = _Node()
                    self.size += 1
                child.count += 1
                grown.append(child)
            self._open = grown[-(self.window - 1):]  # a run of `window` tokens is complete

    def end_sequence(self) -> None:
        """The next `feed` starts a new sequence (no run spans the two)."""
        self._open = []

    def clear(self) -> None:
        self.root, self.size, self._open = _Node(), 0, []

    def match(self, context: list[int], min_len: int, max_len: int) -> Match | None:
        """The longest suffix of `context` (min_len..max_len tokens) seen with a continuation."""
        for n in range(min(max_len, len(context), self.window - 1), min_len - 1, -1):
            node: _Node | None = self.root
            for token in context[len(context) - n:]:
                if node is None:
                    break
                node = node.children.get(token)
            if node is not None and node.children:
                return Match(node, n)
        return None

    @staticmethod
    def expand(start: Match, budget: int, max_breadth: int, max_depth: int) -> DraftTree:
        """Up to `budget` nodes continuing the match, most likely first: a node's likelihood is the
        product of its ancestors' continuation frequencies; at most `max_breadth` children per node,
        `max_depth` levels."""
        tokens: list[int] = []
        parents: list[int] = []
        if budget <= 0:
            return DraftTree(tokens, parents)
        heap: list[tuple[float, int, int, _Node, int, int]] = []  # (-p, tiebreak, token, node, parent, depth)
        tiebreak = 0

        def push_children(node: _Node, prob: float, parent: int, depth: int) -> None:
            nonlocal tiebreak
            total = sum(c.count for c in node.children.values())
            best = heapq.nlargest(max_breadth, node.children.items(), key=lambda kv: kv[1].count)
            for token, child in best:
                heapq.heappush(heap, (-prob * child.count / total, tiebreak, token, child, parent, depth))
                tiebreak += 1

        push_children(start.node, 1.0, -1, 1)
        while heap and len(tokens) < budget:
            neg_p, _, token, node, parent, depth = heapq.heappop(heap)
            tokens.append(token)
            parents.append(parent)
            if depth < max_depth and node.children:
                push_children(node, -neg_p, len(tokens) - 1, depth + 1)
        return DraftTree(tokens, parents)
