"""GPTQ (Frantar et al., 2022): round a linear's weights one input column at a time and push each
column's rounding error onto the columns not yet rounded, weighted by the inverse Hessian of the layer's
squared output error, H = 2 X X^T over calibration inputs X.

For column q with U the upper Cholesky factor of H^-1 (restricted to the columns from q on, which the
factor's rows give without re-inverting), err = (w_q - quant(w_q)) / U_qq and W[:, q:] -= err U_q,q:.
Columns are taken in blocks of `block_size`: updates inside a block are applied at once, and the block's
errors reach later columns in one matmul ("lazy batch updates"), which is the same arithmetic reordered.
Act-order takes the columns by descending diag(H), so the most sensitive ones are rounded while most
columns are still free to absorb errors; the checkpoint's g_idx then records each column's group.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.quant_formats import IntWeight


@dataclass(frozen=True, slots=True)
class GPTQSpec:
    bits: int = 4
    group_size: int = 128  # -1: one group per row
    sym: bool = False
    act_order: bool = False
    percdamp: float = 0.01  # dampening: this fraction of mean(diag(H)) added to the diagonal
    # columns per lazy batch update; any size gives the same arithmetic. 32 on CPU: the in-block updates
    # (rows x block / 2 per column) then cost a quarter of 128's, the rest goes to one matmul per block
    block_size: int = 32


def group_params(w: torch.Tensor, bits: int, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale [N], zero [N]) for the columns `w` [N, g], min-max over a range that includes 0 (as GPTQ's
    reference does). Scales are fp16-exact (as stored); zeros are kept in [1, 2**bits - 1] because the
    v1 GPTQ format stores zero - 1 unsigned."""
    maxq = 2**bits - 1
    lo, hi = w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0)
    if sym:
        hi = torch.maximum(-lo, hi)
        lo = -hi
    scale = ((hi - lo) / maxq).half().to(w.dtype)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.full_like(scale, (maxq + 1) // 2) if sym else torch.round(-lo / scale)
    return scale, zero.clamp(1, maxq)


def round_column(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    return (torch.round(w / scale) + zero).clamp(0, 2**bits - 1)


def rtn_quantize(weight: torch.Tensor, spec: GPTQSpec) -> IntWeight:
    """Round-to-nearest with GPTQ's groups and parameters: the baseline GPTQ improves on."""
    n, k = weight.shape
    gs = spec.group_size if spec.group_size > 0 else k
    w, groups = weight.float(), -(-k // gs)
    codes = torch.empty(n, k, dtype=torch.int32)
    scales, zeros = torch.empty(n, groups), torch.empty(n, groups)
    for g in range(groups):
        cols = slice(g * gs, min((g + 1) * gs, k))
        scales[:, g], zeros[:, g] = group_params(w[:, cols], spec.bits, spec.sym)
        codes[:, cols] = round_column(w[:, cols], scales[:, g:g + 1], zeros[:, g:g + 1], spec.bits).int()
    return IntWeight(codes, zeros.int(), scales.half(), torch.arange(k) // gs, spec.bits)


def dampened_hessian(hessian: torch.Tensor, weight: torch.Tensor, percdamp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(H + percdamp * mean(diag H) * I, W) with dead inputs (diag 0: never active) given H_jj = 1, W_:j = 0."""
    h, w = hessian.clone(), weight.clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h.diagonal().add_(percdamp * h.diagonal().mean())
    return h, w


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, spec: GPTQSpec) -> IntWeight:
    """weight [N, K], hessian [K, K] (computed in their dtype: fp32, or fp64 for a reference)."""
    threads = torch.get_num_threads()
    # thousands of tiny per-column ops: on a busy machine each multi-threaded one waits for a descheduled
    # thread (SmolLM2's gate/up took 20 s with 2 threads, 1.1 s with 1)
    torch.set_num_threads(1)
    try:
        return _gptq(weight, hessian, spec)
    finally:
        torch.set_num_threads(threads)


def _gptq(weight: torch.Tensor, hessian: torch.Tensor, spec: GPTQSpec) -> IntWeight:
    n, k = weight.shape
    gs = spec.group_size if spec.group_size > 0 else k
    if gs != k and spec.block_size % gs and gs % spec.block_size:
        raise ValueError(f"group_size {gs} and block_size {spec.block_size}: one must divide the other")
    h, w = dampened_hessian(hessian, weight, spec.percdamp)
    order = torch.argsort(h.diagonal(), descending=True) if spec.act_order else torch.arange(k)
    h = h[order][:, order]
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    # W transposed: column q of W is row q here, contiguous, so the per-column steps touch dense memory
    wt = w[:, order].T.contiguous()
    codes, errors = torch.empty_like(wt), torch.empty_like(wt)
    groups = -(-k // gs)  # the last group may be shorter (SmolLM2's 576 inputs in groups of 128)
    scales, zeros = torch.empty(groups, n, dtype=w.dtype), torch.empty(groups, n, dtype=w.dtype)
    for b0 in range(0, k, spec.block_size):
        b1 = min(b0 + spec.block_size, k)
        for col in range(b0, b1):
            g = col // gs
            # a group's range, from its columns as all earlier columns' updates left them: a group starts
            # at a block's start (every earlier block's update applied) or inside one (in-block updates are)
            if col % gs == 0:
                scales[g], zeros[g] = group_params(wt[col:col + gs].T, spec.bits, spec.sym)
            codes[col] = round_column(wt[col], scales[g], zeros[g], spec.bits)
            err = torch.div(wt[col] - scales[g] * (codes[col] - zeros[g]), u[col, col], out=errors[col])
            wt[col + 1:b1].addr_(u[col, col + 1:b1], err, alpha=-1)
        wt[b1:].addmm_(u[b0:b1, b1:].T, errors[b0:b1], alpha=-1)  # the block's errors reach later columns at once
    return _in_input_order(codes.T.int(), scales.T, zeros.T, order, gs, spec.bits)


def _in_input_order(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, order: torch.Tensor,
                    gs: int, bits: int) -> IntWeight:
    """Columns back in input order; g_idx[order[j]] = j // gs (the j-th column rounded is in group j // gs)."""
    k = codes.shape[1]
    unsorted = torch.empty_like(codes)
    unsorted[:, order] = codes
    g_idx = torch.empty(k, dtype=torch.long)
    g_idx[order] = torch.arange(k) // gs
    return IntWeight(unsorted, zeros.int(), scales.half(), g_idx, bits)
