"""The gathered LoRA delta of a step whose rows use different adapters (S-LoRA / Punica's batched LoRA).

The base linear runs once over every row; then each row that has an adapter adds its low-rank delta
y[t] += B[s] (A[s] x[t]), with s its adapter's slot in the stacked weights A [slots, R, K] and B^T [slots, R, N]
(the adapter's scaling already folded into B, ranks zero-padded to R). Rows of the base model (no adapter) cost
nothing.

Batch invariance: a row's delta must be the same bits whatever rows run beside it. The rows of each slot are
gathered into tiles of exactly TILE rows (the last one padded by repeating a row) and every tile runs the same
fixed-shape product [TILE, K] x [K, R] then [TILE, R] x [R, N], so each row's sums run in one order, set by
the shapes alone and never by the batch (a plain matmul over a variable row count switches kernels and
blocking with it). The Triton kernel (kernels/triton/lora.py) takes the same plan.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TILE = 16  # rows per tile: tl.dot's smallest row block, and a small pad for a decode's few rows per adapter


@dataclass(frozen=True, slots=True)
class LoraPlan:
    """Where one step's adapter rows sit: a tile's rows all use one slot."""

    rows: torch.Tensor  # [tiles * TILE] int64: the token row at each tile position (padding repeats a real row)
    valid: torch.Tensor  # [tiles * TILE] int8: 1 where the position is a real row (not padding)
    tile_slots: torch.Tensor  # [tiles] int64: each tile's slot in the stacked weights
    targets: torch.Tensor  # the real rows, in tile order (rows[valid])
    positions: torch.Tensor  # their positions in `rows` (nonzero of valid)

    @property
    def num_tiles(self) -> int:
        return self.tile_slots.numel()


def plan_rows(slots: list[int], device: torch.device) -> LoraPlan | None:
    """The tiles of a step whose token t uses slot slots[t] (0: the base model, no delta); None: no adapter."""
    by_slot: dict[int, list[int]] = {}
    for row, slot in enumerate(slots):
        if slot:
            by_slot.setdefault(slot, []).append(row)
    if not by_slot:
        return None
    rows: list[int] = []
    valid: list[bool] = []
    tile_slots: list[int] = []
    for slot, members in sorted(by_slot.items()):
        for start in range(0, len(members), TILE):
            tile = members[start:start + TILE]
            pad = TILE - len(tile)
            rows += tile + [tile[0]] * pad
            valid += [True] * len(tile) + [False] * pad
            tile_slots.append(slot)
    rows_t = torch.tensor(rows, dtype=torch.int64, device=device)
    valid_t = torch.tensor(valid, dtype=torch.int8, device=device)
    positions = torch.tensor([i for i, v in enumerate(valid) if v], dtype=torch.int64, device=device)
    return LoraPlan(rows_t, valid_t, torch.tensor(tile_slots, dtype=torch.int64, device=device),
                    rows_t[positions], positions)


def lora_delta_torch(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, plan: LoraPlan) -> torch.Tensor:
    """Adds each planned row's delta to y [T, N] in place (returned), in torch: the CPU path, and the Triton
    kernel's oracle. x [T, K]; a [slots, R, K]; bt [slots, R, N] (B transposed: a plain bmm operand); computed
    in a's dtype (the activations')."""
    tiles = plan.num_tiles
    xt = x.index_select(0, plan.rows).to(a.dtype).view(tiles, TILE, x.shape[1])
    h = torch.bmm(xt, a.index_select(0, plan.tile_slots).transpose(1, 2))  # [tiles, TILE, R]
    delta = torch.bmm(h, bt.index_select(0, plan.tile_slots))  # [tiles, TILE, N]
    delta = delta.view(tiles * TILE, -1).index_select(0, plan.positions).to(y.dtype)
    # one add per row (the targets are distinct); index_add_ took ~100 ms a call on the CPU
    return y.index_copy_(0, plan.targets, y.index_select(0, plan.targets) + delta)

