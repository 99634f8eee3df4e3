"""Mixture-of-experts layers: the routers transformers models (softmax top-k, DeepSeek-V3's grouped sigmoid
with its aux-loss-free bias), grouped expert compute, and the physical expert table EPLB fills.

Experts hold their weights as two stacked tensors, [experts, 2 * inter, hidden] (gate | up) and
[experts, hidden, inter]. A forward sorts the (token, choice) pairs by expert and runs one matmul pair per
active expert. Physical experts are what runs: by default one per logical expert; an EPLB placement adds
replicas of hot experts (they index the same logical weights) and the router's choice of a replicated
expert is spread over its replicas by token.
"""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from ..distributed.group import TensorParallel

TRITON = importlib.util.find_spec("triton") is not None


@dataclass(frozen=True, slots=True)
class MoeSpec:
    num_experts: int
    top_k: int
    intermediate_size: int  # each routed expert's
    scoring: str = "softmax"  # "softmax" (Mixtral, Qwen) or "sigmoid" (DeepSeek-V3)
    norm_topk_prob: bool = True  # renormalise the chosen experts' weights to sum to 1
    n_group: int = 1  # DeepSeek: experts in groups; a token picks its experts within topk_group groups
    topk_group: int = 1
    routed_scaling_factor: float = 1.0
    score_bias: bool = False  # DeepSeek-V3's e_score_correction_bias (chooses experts, never weighs them)
    shared_intermediate_size: int = 0  # 0: no shared expert
    shared_gate: bool = False  # Qwen2-MoE: a sigmoid gate scales the shared expert's output
    sparse_layers: tuple[int, ...] = ()  # the layers whose MLP is this MoE; the others are dense


def route(logits: torch.Tensor, spec: MoeSpec, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Router logits [T, experts] (fp32) -> (weights [T, k] fp32, logical expert ids [T, k])."""
    if spec.scoring == "softmax":
        scores = logits.softmax(dim=-1)
        weights, ids = _group_masked(scores, spec).topk(spec.top_k, dim=-1)
    else:
        scores = logits.sigmoid()
        choice = scores if bias is None else scores + bias
        ids = _grouped_topk(choice, spec)
        weights = scores.gather(1, ids)
    if spec.norm_topk_prob:
        weights = weights / (weights.sum(dim=-1, keepdim=True) + (1e-20 if spec.scoring == "sigmoid" else 0.0))
    return weights * spec.routed_scaling_factor, ids


def _group_masked(scores: torch.Tensor, spec: MoeSpec) -> torch.Tensor:
    """DeepSeek-V2's group-limited greedy: experts outside the topk_group groups of highest best score
    weigh 0."""
    if spec.n_group <= 1:
        return scores
    group_scores = scores.view(scores.shape[0], spec.n_group, scores.shape[1] // spec.n_group).amax(dim=-1)
    keep = torch.zeros_like(group_scores, dtype=torch.bool)
    keep.scatter_(1, group_scores.topk(spec.topk_group, dim=-1, sorted=False)[1], True)
    return scores.masked_fill(~keep.repeat_interleave(scores.shape[1] // spec.n_group, dim=1), 0.0)


def _grouped_topk(choice: torch.Tensor, spec: MoeSpec) -> torch.Tensor:
    """DeepSeek-V3's group-limited top-k: each group scores as the sum of its best two experts; only the
    topk_group best groups' experts may be chosen."""
    t = choice.shape[0]
    if spec.n_group > 1:
        grouped = choice.view(t, spec.n_group, choice.shape[1] // spec.n_group)  # no -1: t may be 0
        group_scores = grouped.topk(min(2, grouped.shape[-1]), dim=-1)[0].sum(dim=-1)
        keep = torch.zeros_like(group_scores, dtype=torch.bool)
        keep.scatter_(1, group_scores.topk(spec.topk_group, dim=-1, sorted=False)[1], True)
        choice = choice.masked_fill(~keep.repeat_interleave(grouped.shape[-1], dim=1), float("-inf"))
    return choice.topk(spec.top_k, dim=-1, sorted=False)[1]


@dataclass(slots=True)
class ExpertTable:
    """Physical experts and the logical expert each runs. `replicas[l]`: the physical ids of logical l
    (first `replica_count[l]` entries valid); a replica shares its logical expert's weights."""

    phys_to_logical: torch.Tensor  # [physical] int64
    replicas: torch.Tensor  # [logical, max_replicas] int64
    replica_count: torch.Tensor  # [logical] int64

    @classmethod
    def identity(cls, num_experts: int) -> ExpertTable:
        ids = torch.arange(num_experts)
        return cls(ids, ids[:, None].clone(), torch.ones(num_experts, dtype=torch.int64))

    @classmethod
    def from_phys_to_logical(cls, phys_to_logical: list[int], num_experts: int) -> ExpertTable:
        p2l = torch.tensor(phys_to_logical, dtype=torch.int64)
        counts = torch.bincount(p2l, minlength=num_experts)
        if counts.numel() != num_experts or bool((counts == 0).any()):
            raise ValueError("an expert placement must hold every logical expert at least once")
        replicas = torch.zeros(num_experts, int(counts.max()), dtype=torch.int64)
        seen = [0] * num_experts
        for phys, logical in enumerate(phys_to_logical):
            replicas[logical, seen[logical]] = phys
            seen[logical] += 1
        return cls(p2l, replicas, counts)

    @property
    def num_physical(self) -> int:
        return self.phys_to_logical.numel()

    def to_physical(self, ids: torch.Tensor) -> torch.Tensor:
        """Logical choices [T, k] -> physical ones: token t takes replica t mod (the expert's replica count),
        so a hot expert's tokens split evenly over its replicas."""
        token = torch.arange(ids.shape[0], device=ids.device)[:, None]
        pick = token % self.replica_count[ids]
        return self.replicas[ids, pick]


class Experts(nn.Module):
    """The routed experts of one layer whose weights this rank holds: `local_logical` (all of them unless
    expert parallelism gives each rank its share, distributed/ep.py); with `sliced`, this rank's 1/size of
    each one's intermediate units (its output is then a partial sum over the ranks)."""

    def __init__(self, spec: MoeSpec, hidden_size: int, local_logical: list[int] | None = None,
                 sliced: TensorParallel | None = None):
        super().__init__()
        self.local_logical = list(range(spec.num_experts)) if local_logical is None else local_logical
        n, ranks = len(self.local_logical), 1 if sliced is None else sliced.size
        if spec.intermediate_size % ranks:
            raise ValueError(f"moe intermediate size {spec.intermediate_size} does not split over tp_size "
                             f"{ranks} (ep_size 1 slices every expert)")
        self.inter, self.rank = spec.intermediate_size // ranks, 0 if sliced is None else sliced.rank
        self.gate_up_proj = nn.Parameter(torch.empty(n, 2 * self.inter, hidden_size))
        self.down_proj = nn.Parameter(torch.empty(n, hidden_size, self.inter))
        self.fused: bool | None = None  # the Triton fused-MoE kernel: None = on CUDA where Triton is installed

    def shard(self, param: str, t: torch.Tensor) -> torch.Tensor:
        """This rank's experts (or slices of them) out of the checkpoint's stacked [experts, ...] tensor."""
        t = t[self.local_logical] if len(self.local_logical) < t.shape[0] else t
        full = t.shape[-1] if param == "down_proj" else t.shape[1] // 2
        if full == self.inter:
            return t
        units = slice(self.rank * self.inter, (self.rank + 1) * self.inter)
        if param == "down_proj":
            return t[:, :, units]
        gate, up = t.chunk(2, dim=1)
        return torch.cat([gate[:, units], up[:, units]], dim=1)

    def forward(self, x: torch.Tensor, phys: torch.Tensor, weights: torch.Tensor,
                phys_to_logical: torch.Tensor, num_physical: int) -> torch.Tensor:
        """x [T, H]; phys, weights [T, k] -> sum over k of weight * expert(x), [T, H]."""
        if self.fused if self.fused is not None else (x.is_cuda and TRITON):
            from ...kernels.triton.moe import fused_moe

            return fused_moe(x, self.gate_up_proj, self.down_proj, phys_to_logical[phys], weights)
        k = phys.shape[1]
        flat = phys.flatten()
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=num_physical).tolist()
        tokens = order // k
        out = grouped_mlp(x.index_select(0, tokens), counts, phys_to_logical.tolist(),
                          self.gate_up_proj, self.down_proj)
        out = out * weights.flatten().index_select(0, order).unsqueeze(1).to(out.dtype)
        return torch.zeros_like(x).index_add_(0, tokens, out)


def grouped_mlp(rows: torch.Tensor, counts: list[int], expert_of: list[int], gate_up: torch.Tensor,
                down: torch.Tensor) -> torch.Tensor:
    """Rows sorted by expert (counts[i] rows for group i, which runs expert expert_of[i]'s weights):
    one SwiGLU matmul pair per non-empty group."""
    out = torch.empty(rows.shape[0], down.shape[1], dtype=rows.dtype, device=rows.device)
    start = 0
    for group, n in enumerate(counts):
        if n == 0:
            continue
        e = expert_of[group]
        gate, up = F.linear(rows[start:start + n], gate_up[e]).chunk(2, dim=-1)
        out[start:start + n] = F.linear(F.silu(gate) * up, down[e])
        start += n
    return out


class Router(nn.Module):
    def __init__(self, spec: MoeSpec, hidden_size: int):
        super().__init__()
        self.spec = spec
        self.weight = nn.Parameter(torch.empty(spec.num_experts, hidden_size))
        if spec.score_bias:
            self.e_score_correction_bias: nn.Parameter | None = nn.Parameter(torch.zeros(spec.num_experts))
        else:
            self.e_score_correction_bias = None

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = F.linear(x.float(), self.weight.float())
        bias = None if self.e_score_correction_bias is None else self.e_score_correction_bias.float()
        return route(logits, self.spec, bias)
