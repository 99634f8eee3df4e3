"""Expert parallelism over the tensor-parallel ranks: rank r holds physical experts
[r * per_rank, (r + 1) * per_rank) and runs them for every rank's tokens.

Attention leaves every rank with all of the step's hidden states. Each rank routes its own slice of the
tokens, dispatches each (token, choice) row to the rank holding its expert (all_to_all with split sizes:
the counts first, then the rows and their expert ids), runs its experts grouped, returns the outputs along
the reverse split (combine), weighs and sums them per token, and an all-reduce of the slices gives every
rank the whole step's MoE output.
"""
from __future__ import annotations

import torch

from ..models.moe import ExpertTable, grouped_mlp
from .group import TensorParallel


class ExpertParallel:
    def __init__(self, tp: TensorParallel, num_physical: int):
        if num_physical % tp.size:
            raise ValueError(f"{num_physical} experts do not split over ep_size {tp.size}: it must divide them")
        self.tp, self.per_rank = tp, num_physical // tp.size

    def __call__(self, experts, x: torch.Tensor, phys: torch.Tensor, weights: torch.Tensor,
                 table: ExpertTable) -> torch.Tensor:
        tp, k = self.tp, phys.shape[1]
        chunk = -(-x.shape[0] // tp.size)
        lo, hi = min(tp.rank * chunk, x.shape[0]), min((tp.rank + 1) * chunk, x.shape[0])
        flat = phys[lo:hi].flatten()
        order = flat.argsort(stable=True)  # by expert, so by owning rank
        send_sizes = torch.bincount(flat // self.per_rank, minlength=tp.size)
        recv_sizes = tp.all_to_all(send_sizes, [1] * tp.size, [1] * tp.size).tolist()
        send_sizes = send_sizes.tolist()
        tokens = lo + order // k
        rows = tp.all_to_all(x.index_select(0, tokens), send_sizes, recv_sizes)
        ids = tp.all_to_all(flat[order], send_sizes, recv_sizes)
        out = tp.all_to_all(self._run_local(experts, rows, ids, table), recv_sizes, send_sizes)
        out = out * weights[lo:hi].flatten().index_select(0, order).unsqueeze(1).to(out.dtype)
        return tp.all_reduce(torch.zeros_like(x).index_add_(0, tokens, out))

    def _run_local(self, experts, rows: torch.Tensor, ids: torch.Tensor, table: ExpertTable) -> torch.Tensor:
        """This rank's experts over the rows dispatched to it (any order), outputs in the same order."""
        first = self.tp.rank * self.per_rank
        order = ids.argsort(stable=True)
        counts = torch.bincount(ids - first, minlength=self.per_rank).tolist()
        local = table.phys_to_logical[first:first + self.per_rank].tolist()
        slot_of = {logical: i for i, logical in enumerate(experts.local_logical)}
        out = grouped_mlp(rows.index_select(0, order), counts, [slot_of[e] for e in local],
                          experts.gate_up_proj, experts.down_proj)
        return torch.empty_like(out).index_copy_(0, order, out)
