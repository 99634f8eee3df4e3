"""A tensor-parallel group: this rank's place in it and the collectives the sharded layers call.

Built on torch.distributed's process-group objects directly (no global default group), so one process
may hold several engines. Size 1 is the single-process case: every collective is the identity.
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

LOCALHOST = "127.0.0.1"


@dataclass(slots=True)
class TensorParallel:
    rank: int = 0
    size: int = 1
    group: dist.ProcessGroup | None = None  # set by `join` (never at size 1)
    # row-parallel linears hold whole-K output features and all-gather, instead of summing K-split partial
    # products: a rank then computes TP 1's bits (distributed/layers.py: RowParallelLinear). The CPU's ranks do
    gathered_rows: bool = False

    @classmethod
    def on(cls, rank: int, size: int, device: torch.device) -> "TensorParallel":
        """Rank `rank` of `size` as the engine builds it on `device`: gathered row-parallel linears on the CPU.
        Every place that builds or loads a rank's model (the engine, workers, weight updates) takes it from here,
        so their shapes agree."""
        return cls(rank, size, gathered_rows=device.type == "cpu")

    @property
    def _joined(self) -> dist.ProcessGroup:
        """The group the collectives run on: only at size > 1, which `join`s first."""
        assert self.group is not None, "a collective at size > 1 before join"
        return self.group

    def all_reduce(self, t: torch.Tensor) -> torch.Tensor:
        """Sums `t` over the ranks, in place."""
        if self.size > 1:
            self._joined.allreduce([t]).wait()
        return t

    def gather_vocab(self, local: torch.Tensor, vocab_size: int) -> torch.Tensor:
        """Each rank's [rows, shard] logits -> [rows, vocab_size] on rank 0; other ranks get their own
        shard back (their result is not used)."""
        if self.size == 1:
            return local
        parts = self.gather(local)
        return torch.cat(parts, dim=-1)[..., :vocab_size] if parts else local

    def gather(self, t: torch.Tensor) -> list[torch.Tensor]:
        """Every rank's `t` (the same shape everywhere) on rank 0, in rank order; other ranks get []."""
        if self.size == 1:
            return [t]
        t = t.contiguous()
        opts = dist.GatherOptions()
        opts.rootRank = 0
        if self.rank != 0:
            self._joined.gather([], [t], opts).wait()
            return []
        parts = [torch.empty_like(t) for _ in range(self.size)]
        self._joined.gather([parts], [t], opts).wait()
        return parts

    def all_to_all(self, t: torch.Tensor, send_sizes: list[int], recv_sizes: list[int]) -> torch.Tensor:
        """Rows of `t` (send_sizes[r] for rank r, in rank order) to their ranks; returns the rows received,
        recv_sizes[r] from rank r, in rank order (all_to_all_single with split sizes)."""
        out = t.new_empty((sum(recv_sizes), *t.shape[1:]))
        if self.size == 1:
            return out.copy_(t)
        self._joined.alltoall_base(out, t.contiguous(), recv_sizes, send_sizes, dist.AllToAllOptions()).wait()
        return out

    def all_gather(self, t: torch.Tensor, dim: int = 0) -> torch.Tensor:
        """Every rank's `t` (the same shape everywhere), concatenated in rank order along `dim`."""
        if self.size == 1:
            return t
        parts = [torch.empty_like(t, memory_format=torch.contiguous_format) for _ in range(self.size)]
        self._joined.allgather([parts], [t.contiguous()]).wait()
        return torch.cat(parts, dim=dim)

    def broadcast(self, t: torch.Tensor) -> torch.Tensor:
        """Rank 0's `t` into every rank's `t` (same shape and dtype everywhere)."""
        if self.size > 1:
            opts = dist.BroadcastOptions()
            opts.rootRank = 0
            self._joined.broadcast([t], opts).wait()
        return t

    def join(self, store: dist.TCPStore, device: torch.device, timeout_s: float) -> None:
        """Joins the group (blocks until every rank joins); collectives then raise rather than wait
        longer than `timeout_s` for a rank that died or hangs."""
        self.group = _process_group(store, self.rank, self.size, device, datetime.timedelta(seconds=timeout_s))


def open_store(timeout_s: float) -> dist.TCPStore:
    """Rank 0's rendezvous store, on a free localhost port (`store.port`), opened before the workers start."""
    return dist.TCPStore(LOCALHOST, 0, None, True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def connect_store(port: int, timeout_s: float) -> dist.TCPStore:
    """A worker's client of rank 0's store."""
    return dist.TCPStore(LOCALHOST, port, None, False, timeout=datetime.timedelta(seconds=timeout_s))


def _process_group(store: dist.Store, rank: int, size: int, device: torch.device,
                   timeout: datetime.timedelta) -> dist.ProcessGroup:
    """NCCL between GPUs, gloo on the CPU."""
    if device.type == "cuda":
        opts = dist.ProcessGroupNCCL.Options()
        opts._timeout = timeout
        # torch's stubs make the backends no ProcessGroup, though they bind the same collectives
        return dist.ProcessGroupNCCL(store, rank, size, opts)  # type: ignore[return-value]
    opts = dist.ProcessGroupGloo._Options()  # type: ignore[attr-defined]  # bound, but not in torch's stubs
    opts._timeout = timeout
    opts._devices = [dist.ProcessGroupGloo.create_device(hostname=LOCALHOST)]
    return dist.ProcessGroupGloo(store, rank, size, opts)  # type: ignore[return-value]  # as NCCL's, above
