"""Sharded layers of a tensor-parallel model. At tp size 1 each is its plain torch layer (same math, no
communication), so the model has one code path.

Column-parallel linears (qkv, gate_up) split their output rows, row-parallel ones (o, down) their input
columns and sum the partial outputs: two all-reduces per decoder layer (on the CPU they split their output
features and all-gather instead, so that TP N computes TP 1's bits: RowParallelLinear). The embedding and the LM head
split the vocabulary. (The default mode's block-quantized linears replace these at load with shards that
compute one rank's bits: models/linear/sharded_blocks.py.) Each layer's `shard(param_name, full_tensor)` picks this rank's slice of a
checkpoint tensor when weights load.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ...kernels.cpu import dense_linear
from .group import TensorParallel


@dataclass(frozen=True, slots=True)
class Part:
    """A run of `units` heads (or channels) of `unit_size` rows each, split across ranks by unit. With
    fewer units than ranks each unit is replicated: rank r holds unit r * units // size."""

    units: int
    unit_size: int = 1

    def local_units(self, size: int) -> int:
        return max(1, self.units // size)

    def rows(self, rank: int, size: int) -> slice:
        """This rank's rows of the part's full tensor."""
        n = self.local_units(size)
        first = rank * n if self.units >= size else rank * self.units // size
        return slice(first * self.unit_size, (first + n) * self.unit_size)


def shard_parts(t: torch.Tensor, parts: list[Part], tp: TensorParallel, dim: int) -> torch.Tensor:
    """Splits `t` along `dim` into the packed parts and concatenates this rank's slice of each."""
    if tp.size == 1:
        return t
    full = t.split([p.units * p.unit_size for p in parts], dim=dim)
    return torch.cat([chunk.narrow(dim, p.rows(tp.rank, tp.size).start, p.local_units(tp.size) * p.unit_size)
                      for chunk, p in zip(full, parts)], dim=dim)


def check_tp_size(num_heads: int, num_kv_heads: int, intermediate_size: int, hidden_size: int, size: int) -> None:
    """Refuses a tp size that does not split the model's heads, MLP and hidden size evenly (the default mode's
    row-parallel linears split their output features: sharded_blocks.py)."""
    if size < 1:
        raise ValueError(f"tp_size must be >= 1, got {size}")

    def fits(n: int) -> bool:
        return (num_heads % n == 0 and intermediate_size % n == 0 and hidden_size % n == 0
                and (num_kv_heads % n == 0 or n % num_kv_heads == 0))

    if not fits(size):
        ok = [n for n in range(1, num_heads + 1) if fits(n)]
        raise ValueError(
            f"tp_size {size} does not fit this model: it has {num_heads} query heads, {num_kv_heads} KV heads, "
            f"intermediate size {intermediate_size} and hidden size {hidden_size}; the query heads, the "
            f"intermediate size and the hidden size must divide by tp_size, and the KV heads divide by it or it "
            f"by them. tp_size may be one of {ok}")


class FixedOrderLinear(nn.Linear):
    """A linear whose fp32 CPU matmul may run in one reduction order per output, whatever the row count
    (kernels/cpu/dense_linear.py): `fixed_order` is set once, at load (models/llama.py: use_fixed_order)."""

    fixed_order = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dense_linear.linear(x, self.weight, self.bias, self.fixed_order)


class ColumnParallelLinear(FixedOrderLinear):
    """Output rows split across ranks, each packed part (q | k | v, gate | up) on its own; no
    communication: each rank goes on with its own heads or channels."""

    def __init__(self, in_features: int, parts: list[Part], bias: bool, tp: TensorParallel):
        super().__init__(in_features, sum(p.local_units(tp.size) * p.unit_size for p in parts), bias=bias)
        self.parts, self.tp = parts, tp

    def shard(self, param: str, t: torch.Tensor) -> torch.Tensor:
        return shard_parts(t, self.parts, self.tp, dim=0)

    def shard_part(self, index: int, t: torch.Tensor) -> torch.Tensor:
        """This rank's rows of one packed part's full tensor (a q_proj weight of a q | k | v linear)."""
        part = self.parts[index]
        if t.dim() == 0 or t.shape[0] != part.units * part.unit_size:
            raise ValueError(f"has shape {tuple(t.shape)}; the whole part has {part.units * part.unit_size} rows")
        return shard_parts(t, [part], self.tp, dim=0)


class RowParallelLinear(FixedOrderLinear):
    """Input columns split across ranks; the partial products are summed (one all-reduce), and the bias
    is added once, by rank 0.

    `gathered` (tp.gathered_rows: the CPU's ranks): each rank holds 1/size of the output features over the whole
    K instead, all-gathers its input (the ranks hold the part's units in order) and then its outputs. The K-split
    sum added the ranks' partial products in another order than one rank's matmul: TP N's logprobs differed from
    TP 1's in the last bits (issue 43). A fixed-order matmul (dense_mm) computes each feature alone, so the
    gathered layer gives TP 1's bits, at the cost of two all-gathers instead of one all-reduce."""

    def __init__(self, part: Part, out_features: int, bias: bool, tp: TensorParallel):
        gathered = tp.size > 1 and tp.gathered_rows
        if gathered:
            assert part.units % tp.size == 0 and out_features % tp.size == 0, "check_tp_size lets no other split in"
            super().__init__(part.units * part.unit_size, out_features // tp.size, bias=bias)
        else:
            super().__init__(part.local_units(tp.size) * part.unit_size, out_features, bias=bias)
        self.part, self.tp, self.gathered = part, tp, gathered

    def shard(self, param: str, t: torch.Tensor) -> torch.Tensor:
        if self.gathered:  # this rank's output features: weight rows, bias entries
            n = self.out_features
            return t[self.tp.rank * n:(self.tp.rank + 1) * n]
        return t if param == "bias" else shard_parts(t, [self.part], self.tp, dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gathered:
            out = dense_linear.linear(self.tp.all_gather(x, dim=-1), self.weight, self.bias, self.fixed_order)
            return self.tp.all_gather(out, dim=-1)
        bias = self.bias if self.tp.rank == 0 else None
        return self.tp.all_reduce(dense_linear.linear(x, self.weight, bias, self.fixed_order))


def vocab_shard_size(vocab_size: int, size: int) -> int:
    return -(-vocab_size // size)


def shard_vocab(t: torch.Tensor, tp: TensorParallel) -> torch.Tensor:
    """This rank's rows of a [vocab, hidden] tensor, zero-padded so every rank holds the same count."""
    if tp.size == 1:
        return t
    n = vocab_shard_size(t.shape[0], tp.size)
    rows = t[tp.rank * n : (tp.rank + 1) * n]
    return F.pad(rows, (0, 0, 0, n - rows.shape[0]))


class VocabParallelEmbedding(nn.Embedding):
    """Each rank holds a contiguous slice of the vocabulary; ids outside it look up zeros, and the
    all-reduce fills in every row."""

    def __init__(self, vocab_size: int, hidden_size: int, tp: TensorParallel):
        super().__init__(vocab_shard_size(vocab_size, tp.size), hidden_size)
        self.tp = tp

    def shard(self, param: str, t: torch.Tensor) -> torch.Tensor:
        return shard_vocab(t, self.tp)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        if self.tp.size == 1:
            return super().forward(ids)
        local = ids - self.tp.rank * self.num_embeddings
        outside = (local < 0) | (local >= self.num_embeddings)
        out = F.embedding(local.masked_fill(outside, 0), self.weight)
        return self.tp.all_reduce(out.masked_fill(outside.unsqueeze(-1), 0.0))


class ParallelLMHead(FixedOrderLinear):
    """The LM head's rows for this rank's vocabulary slice; the model gathers the logits on rank 0."""

    def __init__(self, hidden_size: int, vocab_size: int, tp: TensorParallel):
        super().__init__(hidden_size, vocab_shard_size(vocab_size, tp.size), bias=False)
        self.tp = tp

    def shard(self, param: str, t: torch.Tensor) -> torch.Tensor:
        return shard_vocab(t, self.tp)


def load_shard(model: nn.Module, name: str, t: torch.Tensor) -> torch.Tensor:
    """This rank's slice of the checkpoint tensor for parameter `name` of `model`."""
    owner, _, param = name.rpartition(".")
    shard = getattr(model.get_submodule(owner), "shard", None)
    return t if shard is None else shard(param, t)


def kv_heads_per_rank(num_kv_heads: int, size: int) -> int:
    """KV heads in each rank's KV pool (1 when the heads are replicated)."""
    return Part(num_kv_heads).local_units(size)
