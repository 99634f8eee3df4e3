"""Expert-parallel load balancing (EPLB): from measured tokens per expert, a placement of physical experts
on ranks that replicates hot experts and packs cold ones, by the hierarchical balanced packing DeepSeek
published (groups of experts to nodes, replicas within a node, physical experts to the node's ranks).

A placement is a physical -> logical map whose physical experts are laid out rank by rank (rank r holds
physical experts [r * per_rank, (r + 1) * per_rank)). A logical expert's tokens split evenly over its
replicas, which is how `ExpertTable.to_physical` spreads the router's choices.
"""
from __future__ import annotations

import heapq
from dataclasses import dataclass

import torch

from .moe import ExpertTable


@dataclass(frozen=True, slots=True)
class Placement:
    phys_to_logical: tuple[int, ...]  # rank by rank, `per_rank` physical experts each
    num_ranks: int

    @property
    def per_rank(self) -> int:
        return len(self.phys_to_logical) // self.num_ranks

    def rank_loads(self, load: list[float]) -> list[float]:
        """Each rank's share of `load` (tokens per logical expert), replicas splitting their expert's evenly."""
        replicas = [0] * len(load)
        for logical in self.phys_to_logical:
            replicas[logical] += 1
        per_phys = [load[logical] / replicas[logical] for logical in self.phys_to_logical]
        n = self.per_rank
        return [sum(per_phys[r * n:(r + 1) * n]) for r in range(self.num_ranks)]


def balanced_packing(weights: list[float], num_packs: int) -> list[int]:
    """Each item's pack: every pack takes len(weights) / num_packs items; heaviest item first, each into
    the lightest pack that still has room."""
    if len(weights) % num_packs:
        raise ValueError(f"{len(weights)} items do not split evenly into {num_packs} packs")
    room = len(weights) // num_packs
    heap = [(0.0, pack) for pack in range(num_packs)]
    counts = [0] * num_packs
    pack_of = [0] * len(weights)
    for item in sorted(range(len(weights)), key=lambda i: -weights[i]):
        total, pack = heapq.heappop(heap)
        pack_of[item] = pack
        counts[pack] += 1
        if counts[pack] < room:
            heapq.heappush(heap, (total + weights[item], pack))
    return pack_of


def replicate(weights: list[float], num_slots: int) -> list[int]:
    """The logical expert of each of `num_slots` physical slots: one each, then every extra slot to the
    expert whose per-replica load is highest."""
    if num_slots < len(weights):
        raise ValueError(f"{num_slots} physical experts cannot hold {len(weights)} logical ones")
    counts = [1] * len(weights)
    heap = [(-w, e) for e, w in enumerate(weights)]
    heapq.heapify(heap)
    for _ in range(num_slots - len(weights)):
        _, e = heapq.heappop(heap)
        counts[e] += 1
        heapq.heappush(heap, (-weights[e] / counts[e], e))
    return [e for e, n in enumerate(counts) for _ in range(n)]


def place_experts(load: list[float], num_physical: int, num_ranks: int, num_groups: int = 1,
                  num_nodes: int = 1) -> Placement:
    """Hierarchical placement: contiguous expert groups are packed onto nodes, each node replicates its
    experts into its share of the physical slots, and the node's physical experts are packed onto its
    ranks. Groups that do not split over the nodes fall back to one node (the global policy)."""
    experts = len(load)
    if experts % num_groups or num_physical % num_ranks or num_ranks % num_nodes:
        raise ValueError("experts must divide into groups, physical experts and ranks into nodes evenly")
    if num_groups % num_nodes:
        num_groups, num_nodes = 1, 1
    group_size = experts // num_groups
    group_loads = [sum(load[g * group_size:(g + 1) * group_size]) for g in range(num_groups)]
    node_of_group = balanced_packing(group_loads, num_nodes)
    ranks_per_node, slots_per_node = num_ranks // num_nodes, num_physical // num_nodes
    layout: list[int] = []
    for node in range(num_nodes):
        logical = [g * group_size + i for g in range(num_groups) if node_of_group[g] == node for i in range(group_size)]
        slots = [logical[i] for i in replicate([load[e] for e in logical], slots_per_node)]
        copies = {e: slots.count(e) for e in logical}
        rank_of = balanced_packing([load[e] / copies[e] for e in slots], ranks_per_node)
        for rank in range(ranks_per_node):
            layout.extend(e for e, r in zip(slots, rank_of, strict=True) if r == rank)
    return Placement(tuple(layout), num_ranks)


def expert_load(blocks) -> torch.Tensor:
    """[sparse layers, experts] tokens each layer's router sent to each logical expert so far."""
    return torch.stack([b.load.cpu() for b in blocks])


def plan_rebalance(load: torch.Tensor, num_physical: int, num_ranks: int, num_groups: int = 1,
                   num_nodes: int = 1) -> list[Placement]:
    """Each MoE layer's placement from its measured load ([sparse layers, experts], as `expert_load`)."""
    return [place_experts(layer.tolist(), num_physical, num_ranks, num_groups, num_nodes) for layer in load]


def apply_placements(blocks, placements: list[Placement]) -> None:
    """Applies one placement per layer (replicas share their expert's weights, so outputs are unchanged);
    the counters restart. Under expert parallelism every rank applies the same placements (weights move)."""
    for block, placement in zip(blocks, placements, strict=True):
        block.set_table(ExpertTable.from_phys_to_logical(list(placement.phys_to_logical), block.spec.num_experts))
        block.load.zero_()
