"""The gathered LoRA delta of a step whose rows use different adapters (S-LoRA / Punica's batched LoRA).

The base linear runs once over every row; then each row that has an adapter adds its low-rank delta
y[t] += B[s] (A[s] x[t]), with s its adapter's slot in the stacked weights A [slots, R, K] and B^T [slots, R, N]
(the adapter's scaling already folded into B, ranks zero-padded to R). Rows of the base model (no adapter) cost
nothing.

Batch invariance: a row's delta must be the same bits whatever rows run beside it. The rows of each slot are
gathered into tiles of exactly `tile` rows (the last one padded by repeating a row) and every tile runs the same
fixed-shape product [tile, K] x [K, R] then [tile, R] x [R, N], so each row's sums run in one order, set by
the shapes alone and never by the batch (a plain matmul over a variable row count switches kernels and
blocking with it). The Triton kernel (kernels/triton/lora.py) takes the same plan, with tiles of 16 rows
(tl.dot's smallest); the CPU's are 4 rows, as a decode has a few rows per adapter and padding is paid in full.

On the CPU each slot's run of tiles is one batched matmul against the slot's weights broadcast (no copy): a
decode of 16 rows over 8 adapters reads each adapter's weights once. Where the block kernel's library is loaded the
CPU runs `lora_delta_cpu` instead: the native kernel (kernels/cpu/lora_mm.cpp) takes each row's slot, needs no
plan, and does a fused linear's whole delta in one call, every row's sums in an order fixed per row.

The token embedding's and the LM head's deltas (their A and B are vocabulary-sized, and one step's rows need a
few of the embedding's columns): the head is a linear of the step's logits rows (the paths above); the
embedding's delta runs in torch on every device, `lora_embedding_torch`, which gathers each row's rank activations
by token id where a linear multiplies.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

TILE = 16  # rows per tile on CUDA: tl.dot's smallest row block
CPU_TILE = 4  # rows per tile on the CPU (measured at SmolLM2's shapes, rank 16: 16 rows took 2.5x a decode's time)


@dataclass(frozen=True, slots=True)
class LoraPlan:
    """Where one step's adapter rows sit: a tile's rows all use one slot."""

    tile: int  # rows per tile
    rows: torch.Tensor  # [tiles * tile] int64: the token row at each tile position (padding repeats a real row)
    valid: torch.Tensor  # [tiles * tile] int8: 1 where the position is a real row (not padding)
    tile_slots: torch.Tensor  # [tiles] int64: each tile's slot in the stacked weights
    targets: torch.Tensor  # the real rows, in tile order (rows[valid])
    positions: torch.Tensor  # their positions in `rows` (nonzero of valid)
    runs: list[tuple[int, int, int]]  # (slot, first tile, tiles): each slot's tiles, consecutive

    @property
    def num_tiles(self) -> int:
        return self.tile_slots.numel()


def plan_rows(slots: list[int], device: torch.device, tile: int | None = None) -> LoraPlan | None:
    """The tiles of a step whose token t uses slot slots[t] (0: the base model, no delta); None: no adapter.
    Tiles are `tile` rows: by default TILE on CUDA (the Triton kernel's), CPU_TILE elsewhere."""
    size = tile or (TILE if device.type == "cuda" else CPU_TILE)
    by_slot: dict[int, list[int]] = {}
    for row, slot in enumerate(slots):
        if slot:
            by_slot.setdefault(slot, []).append(row)
    if not by_slot:
        return None
    rows: list[int] = []
    valid: list[bool] = []
    tile_slots: list[int] = []
    runs = []
    for slot, members in sorted(by_slot.items()):
        runs.append((slot, len(tile_slots), -(-len(members) // size)))
        for start in range(0, len(members), size):
            chunk = members[start:start + size]
            pad = size - len(chunk)
            rows += chunk + [chunk[0]] * pad
            valid += [True] * len(chunk) + [False] * pad
            tile_slots.append(slot)
    rows_t = torch.tensor(rows, dtype=torch.int64, device=device)
    valid_t = torch.tensor(valid, dtype=torch.int8, device=device)
    positions = torch.tensor([i for i, v in enumerate(valid) if v], dtype=torch.int64, device=device)
    return LoraPlan(size, rows_t, valid_t, torch.tensor(tile_slots, dtype=torch.int64, device=device),
                    rows_t[positions], positions, runs)


def native_available() -> bool:
    """Whether the CPU's native delta is loaded (the block kernel's library; a missing build starts in the
    background and this process keeps the torch path)."""
    from .cpu import block_kernel

    return block_kernel.available()


def lora_delta_cpu(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, slots: torch.Tensor,
                   columns: list[int], scales: tuple[torch.Tensor, torch.Tensor] | None = None) -> torch.Tensor:
    """Adds each row's delta to y [T, N] in place (returned) on the native kernel: slots [T] int64 (0: none);
    a [slots, G R, K] and bt [slots, G R, N] in fp32, bf16, or int8 with `scales` (fp32 [slots, G R] per rank
    row of each, quantize_rows'); target g's rank rows [g R, g R + R) feed only the columns
    [columns[g], columns[g + 1]) (the fused q|k|v B's zero blocks are skipped)."""
    out = y if y.is_contiguous() else y.contiguous()
    a_scale, bt_scale = scales if scales is not None else (None, None)
    torch.ops.radixlang_cpu.lora_delta(out, x, a, bt, slots, columns, a_scale, bt_scale)
    return out


def quantize_rows(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(int8 codes, fp32 scale per row) of w [..., rows, features]: round to nearest of w / (absmax / 127);
    an all-zero row (rank padding) has scale 0 and codes 0."""
    w = w.float()
    scale = w.abs().amax(-1) / 127
    codes = torch.where(scale[..., None] > 0, w / scale.clamp_min(torch.finfo(torch.float32).tiny)[..., None], 0)
    return codes.round().clamp(-127, 127).to(torch.int8), scale


def lora_delta_torch(y: torch.Tensor, x: torch.Tensor, a: torch.Tensor, bt: torch.Tensor, plan: LoraPlan) -> torch.Tensor:
    """Adds each planned row's delta to y [T, N] in place (returned), in torch: the CPU path, and the Triton
    kernel's oracle. x [T, K]; a [slots, R, K]; bt [slots, R, N] (B transposed: a plain bmm operand); computed
    in a's dtype (the activations')."""
    xt = x.index_select(0, plan.rows).to(a.dtype).view(plan.num_tiles, plan.tile, x.shape[1])
    # each tile one [tile, K] x [K, R] product, the slot's weights broadcast
    h = torch.cat([torch.bmm(xt[first:first + n], a[slot].T.expand(n, -1, -1)) for slot, first, n in plan.runs])
    return _expand(y, h, bt, plan)


def lora_embedding_torch(y: torch.Tensor, ids: torch.Tensor, a: torch.Tensor, bt: torch.Tensor,
                         plan: LoraPlan) -> torch.Tensor:
    """Adds each planned row's embedding delta to y [T, N] in place (returned): row t of slot s adds
    a[s, ids[t]] @ bt[s], with a [slots, vocab, R] (PEFT's lora_embedding_A transposed: a token's rank activations
    are its row, a gather) and bt [slots, R, N]. The expansion sums the R terms one at a time in fp32 (R
    elementwise ops per slot, no matmul whose blocking could follow the row count), so a row's delta is the same
    bits on any device whatever rows run beside it."""
    tile_slots = plan.tile_slots.repeat_interleave(plan.tile)
    h = a[tile_slots, ids.index_select(0, plan.rows)].float()  # [positions, R]
    parts = []
    for slot, first, n in plan.runs:
        rows, b = h[first * plan.tile:(first + n) * plan.tile], bt[slot].float()
        part = rows[:, :1] * b[0]
        for r in range(1, b.shape[0]):
            part = part + rows[:, r:r + 1] * b[r]
        parts.append(part)
    return _add_rows(y, torch.cat(parts), plan)


def _expand(y: torch.Tensor, h: torch.Tensor, bt: torch.Tensor, plan: LoraPlan) -> torch.Tensor:
    """y's planned rows plus their rank activations h [tiles, tile, R] expanded by their slot's bt [R, N]."""
    # each tile one [tile, R] x [R, N] product
    parts = [torch.bmm(h[first:first + n], bt[slot].expand(n, -1, -1)) for slot, first, n in plan.runs]
    return _add_rows(y, torch.cat(parts).view(plan.num_tiles * plan.tile, -1), plan)


def _add_rows(y: torch.Tensor, delta: torch.Tensor, plan: LoraPlan) -> torch.Tensor:
    """y plus delta [tiles * tile, N] (a row per plan position) at the plan's real rows, in place."""
    delta = delta.index_select(0, plan.positions).to(y.dtype)
    # one add per row (the targets are distinct); index_add_ took ~100 ms a call on the CPU
    return y.index_copy_(0, plan.targets, y.index_select(0, plan.targets) + delta)
