"""One step's work: the scheduled items, the attention batch they make, and where their logits rows sit."""
from __future__ import annotations

from collections import Counter, defaultdict
from dataclasses import dataclass, field

import torch

from ..kernels.backend import AttentionBatch
from .draft_tree import depths
from .request import Req


@dataclass(slots=True)
class ScheduledItem:
    """Tokens [start, start + length) of `req`'s sequence get their KV computed this step, into those
    positions of its req_to_token row.

    `parents` is None for a chain (each token follows the one before it); otherwise parents[j] is the
    index within this item of token j's parent (-1: the token at start - 1), so a token tree (a
    speculative draft) is one item, with each token placed at start + its depth in the tree.
    """

    req: Req
    start: int
    length: int
    parents: list[int] | None = None

    @property
    def end(self) -> int:
        return self.start + self.length

    @property
    def row(self) -> int:
        """The request's req_to_token row: the KV manager gives every scheduled request one."""
        assert self.req.row is not None, f"scheduled request {self.req.rid} has no row"
        return self.req.row

    @property
    def completes_fill(self) -> bool:
        return self.end == self.req.fill_len

    @property
    def samples(self) -> bool:
        return self.completes_fill and len(self.req.output_ids) + self.req.num_draft < self.req.max_new_tokens

    def positions(self) -> list[int]:
        if self.parents is None:
            return list(range(self.start, self.end))
        return [self.start + d for d in depths(self.parents)]

    @property
    def sample_offsets(self) -> range:
        """Offsets in this item of the tokens whose logits are sampled: the request's last verified token,
        then its draft nodes (row 1 + i checks the children of node i, row 0 the root's)."""
        if not self.samples:
            return range(0)
        first = self.length - 1 - self.req.num_draft
        assert first >= 0, "a draft is never split across items"
        return range(first, self.length)

    def prompt_logit_positions(self) -> range:
        """Positions in this item whose logits score a prompt token the caller asked about."""
        if not self.req.wants_prompt_logprobs:
            return range(0)
        lo = max(self.start, self.req.next_prompt_logit)
        hi = min(self.end, len(self.req.prompt_ids) - 1)
        return range(lo, max(lo, hi))


@dataclass(slots=True)
class Finish:
    """A decision that `req` ends: finish_reason "stop" | "length" | "abort"; applied by the scheduler."""

    req: Req
    reason: str
    matched: int | str | None = None  # the stop token id or string that ended it
    error: str | None = None


@dataclass(slots=True)
class LogitRows:
    """Where one item's rows sit in the step's [rows, vocab] logits."""

    prompt: range  # score prompt tokens (prompt logprobs)
    samples: range  # the item's sample_offsets: the root's row, then one per draft node


@dataclass(slots=True)
class StepBatch:
    items: list[ScheduledItem]
    rows: list[LogitRows] = field(init=False)
    hidden_rows: list[int] = field(init=False)  # for each logits row, its token's index in the step

    def __post_init__(self) -> None:
        self.rows, self.hidden_rows = [], []
        rows, hidden = self.rows, self.hidden_rows
        offset = 0
        for item in self.items:
            first = len(hidden)
            positions = item.prompt_logit_positions()
            if positions:
                hidden += range(positions.start + offset - item.start, positions.stop + offset - item.start)
            middle = len(hidden)
            offsets = item.sample_offsets
            hidden += range(offsets.start + offset, offsets.stop + offset)
            rows.append(LogitRows(range(first, middle), range(middle, len(hidden))))
            offset += item.length

    def input_ids(self) -> list[int]:
        ids: list[int] = []
        for item in self.items:
            ids += item.req.tokens(item.start, item.end)
        return ids

    def attention_batch(self, req_to_token: torch.Tensor,
                        groups: list[tuple[list[int], int]] | None = None) -> AttentionBatch:
        """`groups`: the step's cascade groups, from `prefix_groups` (None: no cascade)."""
        return AttentionBatch(
            req_to_token=req_to_token,
            rows=[item.row for item in self.items],
            kv_lens=[item.end for item in self.items],
            extend_lens=[item.length for item in self.items],
            positions=[p for item in self.items for p in item.positions()],
            parents=[item.parents for item in self.items],
            prefix_groups=groups or [],
        )


def prefix_groups(items: list[ScheduledItem], min_len: int) -> list[tuple[list[int], int]]:
    """Decodes whose locked radix paths share a node at depth >= min_len: each joins the group of the
    deepest such node on its path, and those positions hold the same KV slots for every member."""
    paths: dict[int, list[tuple[int, int]]] = {}  # item -> (node id, depth) along its path, root first
    users: Counter[int] = Counter()
    for i, item in enumerate(items):
        node = item.req.last_node
        if item.length != 1 or item.parents is not None or node is None:
            continue
        chain = []
        while node.parent is not None:
            chain.append(node)
            node = node.parent
        depth, path = 0, []
        for n in reversed(chain):
            depth += len(n.key)
            path.append((id(n), depth))
        paths[i] = path
        users.update(node_id for node_id, _ in path)
    groups: dict[int, list[int]] = defaultdict(list)
    depth_of: dict[int, int] = {}
    for i, path in paths.items():
        shared = [(node_id, depth) for node_id, depth in path if users[node_id] >= 2 and depth >= min_len]
        if shared:
            node_id, depth = shared[-1]
            groups[node_id].append(i)
            depth_of[node_id] = depth
    return [(members, depth_of[node_id]) for node_id, members in groups.items() if len(members) >= 2]
