"""Expert parallelism over the tensor-parallel ranks: rank r holds physical experts
[r * per_rank, (r + 1) * per_rank) and runs them for every rank's tokens. Its local expert i is physical
expert r * per_rank + i; an EPLB placement (replicas of hot experts) moves the weights to match (`relocate`).

Tensor-parallel attention leaves every rank with all of the step's hidden states: each rank routes its own
slice of the tokens, dispatches each (token, choice) row to the rank holding its expert (all_to_all with
split sizes: the counts first, then the rows and their expert ids), runs its experts grouped, returns the
outputs along the reverse split (combine), weighs and sums them per token, and an all-reduce of the slices
gives every rank the whole step's MoE output.

Under DP attention (`local_tokens`) each rank's hidden states are its own requests' tokens: it routes all of
them, and the combine returns exactly its own outputs (no all-reduce). A rank with no work joins with zero
rows, so every rank calls the same collectives in the same order.
"""
from __future__ import annotations

import torch

from ..models.moe import ExpertTable, grouped_mlp
from .group import TensorParallel


class ExpertParallel:
    def __init__(self, tp: TensorParallel, num_physical: int, local_tokens: bool = False):
        if num_physical % tp.size:
            raise ValueError(f"{num_physical} experts do not split over ep_size {tp.size}: it must divide them")
        self.tp, self.per_rank = tp, num_physical // tp.size
        self.local_tokens = local_tokens  # DP attention: x holds this rank's tokens only

    def __call__(self, experts, x: torch.Tensor, phys: torch.Tensor, weights: torch.Tensor) -> torch.Tensor:
        tp, k = self.tp, phys.shape[1]
        lo, hi = self._my_tokens(x.shape[0])
        flat = phys[lo:hi].flatten()
        order = flat.argsort(stable=True)  # by expert, so by owning rank
        send_counts = torch.bincount(flat // self.per_rank, minlength=tp.size)
        recv_sizes = tp.all_to_all(send_counts, [1] * tp.size, [1] * tp.size).tolist()
        send_sizes = send_counts.tolist()
        tokens = lo + order // k
        rows = tp.all_to_all(x.index_select(0, tokens), send_sizes, recv_sizes)
        ids = tp.all_to_all(flat[order], send_sizes, recv_sizes)
        out = tp.all_to_all(self._run_local(experts, rows, ids), recv_sizes, send_sizes)
        out = out * weights[lo:hi].flatten().index_select(0, order).unsqueeze(1).to(out.dtype)
        mine = torch.zeros_like(x).index_add_(0, tokens, out)
        return mine if self.local_tokens else tp.all_reduce(mine)

    def _my_tokens(self, num_tokens: int) -> tuple[int, int]:
        """The rows this rank routes: all of them under DP attention, else its 1/size slice."""
        if self.local_tokens:
            return 0, num_tokens
        chunk = -(-num_tokens // self.tp.size)
        return min(self.tp.rank * chunk, num_tokens), min((self.tp.rank + 1) * chunk, num_tokens)

    def _run_local(self, experts, rows: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        """This rank's experts over the rows dispatched to it (any order), outputs in the same order."""
        order = ids.argsort(stable=True)
        counts = torch.bincount(ids - self.tp.rank * self.per_rank, minlength=self.per_rank).tolist()
        out = grouped_mlp(rows.index_select(0, order), counts, list(range(self.per_rank)),
                          experts.gate_up_proj, experts.down_proj)
        return torch.empty_like(out).index_copy_(0, order, out)

    def relocate(self, experts, old: ExpertTable, new: ExpertTable) -> None:
        """Makes this rank hold the weights of its physical experts under `new` (a replica gets its logical
        expert's weights). Every rank's experts are gathered once and each rank keeps its share: the one
        collective all ranks call alike (a rank's new experts may sit on any other rank)."""
        if new.num_physical % self.tp.size:
            raise ValueError(f"{new.num_physical} physical experts do not split over ep_size {self.tp.size}")
        per_rank = new.num_physical // self.tp.size
        old_logical = old.phys_to_logical.tolist()
        holder = {logical: phys for phys, logical in reversed(list(enumerate(old_logical)))}
        mine = new.phys_to_logical[self.tp.rank * per_rank:(self.tp.rank + 1) * per_rank].tolist()
        pick = torch.tensor([holder[logical] for logical in mine], device=experts.gate_up_proj.device)
        for param in (experts.gate_up_proj, experts.down_proj):
            param.data = self.tp.all_gather(param.data).index_select(0, pick)
        experts.local_logical = mine
        self.per_rank = per_rank
