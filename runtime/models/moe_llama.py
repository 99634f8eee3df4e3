"""Llama-family attention with mixture-of-experts MLPs: Mixtral, Qwen2-MoE (shared expert + gate) and
Qwen3-MoE. Everything but the sparse layers' MLP is the dense model's."""
from __future__ import annotations

from typing import Iterable, Iterator

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.ep import ExpertParallel
from ..distributed.group import TensorParallel
from .llama import LlamaConfig, LlamaForCausalLM
from .moe import Experts, ExpertTable, MoeSpec, Router


class SharedExpert(nn.Module):
    """A dense SwiGLU MLP beside the routed experts (Qwen2-MoE's shared_expert, DeepSeek's shared_experts)."""

    def __init__(self, hidden_size: int, intermediate_size: int):
        super().__init__()
        self.gate_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.up_proj = nn.Linear(hidden_size, intermediate_size, bias=False)
        self.down_proj = nn.Linear(intermediate_size, hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class SparseMoeBlock(nn.Module):
    """Router -> routed experts (+ shared expert). Counts the tokens each logical expert receives (`load`)
    for EPLB; `table` maps the router's logical choices to the physical experts that run them."""

    load: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, spec: MoeSpec, hidden_size: int, shared_name: str = "shared_expert",
                 ep: TensorParallel | None = None, sliced: TensorParallel | None = None,
                 local_tokens: bool = False):
        """Over several ranks: `ep` partitions the experts over them, or `sliced` gives each rank every
        expert's 1/size slice (outputs summed over the ranks). `local_tokens` (DP attention): each rank's
        input is its own requests' tokens, not the whole step's."""
        super().__init__()
        self.spec = spec
        self.gate = Router(spec, hidden_size)
        self.dispatch = None if ep is None or ep.size == 1 else ExpertParallel(ep, spec.num_experts, local_tokens)
        self.sliced = None if sliced is None or sliced.size == 1 else sliced
        local = None if self.dispatch is None else list(range(self.dispatch.tp.rank * self.dispatch.per_rank,
                                                            (self.dispatch.tp.rank + 1) * self.dispatch.per_rank))
        self.experts = Experts(spec, hidden_size, local, self.sliced)
        self.shared_name = shared_name
        if spec.shared_intermediate_size:
            setattr(self, shared_name, SharedExpert(hidden_size, spec.shared_intermediate_size))
        self.shared_expert_gate = nn.Linear(hidden_size, 1, bias=False) if spec.shared_gate else None
        self.table = ExpertTable.identity(spec.num_experts)
        self.register_buffer("load", torch.zeros(spec.num_experts, dtype=torch.int64), persistent=False)

    def reset(self) -> None:
        """After loading (meta-built buffers hold garbage): zero counts, the identity placement."""
        self.load.zero_()
        self._use(ExpertTable.identity(self.spec.num_experts))

    def set_table(self, table: ExpertTable) -> None:
        """Applies a placement; under expert parallelism every rank calls this alike (weights move)."""
        if self.dispatch is not None:
            self.dispatch.relocate(self.experts, self.table, table)
        self._use(table)

    def _use(self, table: ExpertTable) -> None:
        device = self.load.device
        self.table = ExpertTable(table.phys_to_logical.to(device), table.replicas.to(device),
                                 table.replica_count.to(device))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weights, ids = self.gate(x)
        self.load += torch.bincount(ids.flatten(), minlength=self.spec.num_experts)
        phys = self.table.to_physical(ids)
        if self.dispatch is not None:
            out = self.dispatch(self.experts, x, phys, weights)
        else:
            out = self.experts(x, phys, weights, self.table.phys_to_logical, self.table.num_physical)
            if self.sliced is not None:
                out = self.sliced.all_reduce(out)
        if self.spec.shared_intermediate_size:
            shared = getattr(self, self.shared_name)(x)
            if self.shared_expert_gate is not None:
                shared = torch.sigmoid(self.shared_expert_gate(x)) * shared
            out = out + shared
        return out


def moe_blocks(model: nn.Module) -> list[SparseMoeBlock]:
    """The model's MoE blocks: a MoE model's `moe_blocks()`; a dense model has none."""
    return getattr(model, "moe_blocks", list)()


class MoeLlamaForCausalLM(LlamaForCausalLM):
    """The dense model with the MLP of each layer in `spec.sparse_layers` replaced by a SparseMoeBlock.
    Over several ranks (`tp`), attention is tensor-parallel and the experts expert-parallel (ep = tp), or
    with `expert_parallel` False each rank holds a slice of every expert. With `dp_attention` every rank
    holds the whole attention, dense MLPs, embedding and head (each runs its own requests) and only the
    experts are partitioned over the ranks."""

    capturable = False  # expert grouping reads routing counts on the host: decode buckets run uncaptured

    def __init__(self, cfg: LlamaConfig, spec: MoeSpec, tp: TensorParallel | None = None,
                 expert_parallel: bool = True, dp_attention: bool = False):
        group = tp or TensorParallel()
        super().__init__(cfg, TensorParallel() if dp_attention else group)
        self.moe_spec = spec
        ep, sliced = (group, None) if expert_parallel else (None, group)
        for i in spec.sparse_layers:
            self.layers[i].mlp = SparseMoeBlock(spec, cfg.hidden_size, ep=ep, sliced=sliced, local_tokens=dp_attention)

    def moe_blocks(self) -> list[SparseMoeBlock]:
        return [m for m in self.modules() if isinstance(m, SparseMoeBlock)]

    @torch.no_grad()
    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None = None) -> None:
        super().load_weights(stack_experts(weights, self.moe_spec.num_experts), dtype)


_EXPERT_PARTS = {"gate_proj": "gate", "up_proj": "up", "down_proj": "down",
                 "w1": "gate", "w3": "up", "w2": "down"}  # transformers' per-expert names, and Mixtral's


def stack_experts(weights: Iterable[tuple[str, torch.Tensor]], num_experts: int) -> Iterator[tuple[str, torch.Tensor]]:
    """Per-expert checkpoint tensors (`...experts.E.gate_proj.weight`, Mixtral's `block_sparse_moe.experts.E.w1`)
    -> the stacked `...mlp.experts.gate_up_proj` / `down_proj` this model holds; already-stacked tensors
    (transformers 5's in-memory layout) and every other weight pass through. Mixtral's `block_sparse_moe`
    is this model's `mlp`."""
    pending: dict[str, dict[tuple[str, int], torch.Tensor]] = {}
    for name, tensor in weights:
        name = name.replace(".block_sparse_moe.", ".mlp.")
        parts = name.split(".")
        if "experts" not in parts or not parts[parts.index("experts") + 1].isdigit():
            yield name, tensor
            continue
        at = parts.index("experts")
        prefix, expert, kind = ".".join(parts[:at + 1]), int(parts[at + 1]), _EXPERT_PARTS.get(parts[at + 2])
        if kind is None or parts[-1] != "weight":
            raise ValueError(f"unexpected expert weight {name!r}")
        layer = pending.setdefault(prefix, {})
        layer[(kind, expert)] = tensor
        if len(layer) == 3 * num_experts:
            yield from _stacked(prefix, pending.pop(prefix), num_experts)
    if pending:
        prefix, layer = next(iter(pending.items()))
        missing = sorted({e for e in range(num_experts) for k in ("gate", "up", "down") if (k, e) not in layer})
        raise ValueError(f"checkpoint is missing expert weights of {prefix}: experts {missing[:8]}")


def _stacked(prefix: str, layer: dict[tuple[str, int], torch.Tensor], n: int) -> Iterator[tuple[str, torch.Tensor]]:
    gate_up = [torch.cat([layer[("gate", e)], layer[("up", e)]]) for e in range(n)]
    yield f"{prefix}.gate_up_proj", torch.stack(gate_up)
    yield f"{prefix}.down_proj", torch.stack([layer[("down", e)] for e in range(n)])
