"""GPTQ (Frantar et al., 2022): round a linear's weights one input column at a time and push each
column's rounding error onto the columns not yet rounded, weighted by the inverse Hessian of the layer's
squared output error, H = 2 X X^T over calibration inputs X.

For column q with U the upper Cholesky factor of H^-1 (restricted to the columns from q on, which the
factor's rows give without re-inverting), err = (w_q - quant(w_q)) / U_qq and W[:, q:] -= err U_q,q:.
Columns are taken in blocks of `block_size`: updates inside a block are applied at once, and the block's
errors reach later columns in one matmul ("lazy batch updates"), which is the same arithmetic reordered.
Act-order takes the columns by descending diag(H), so the most sensitive ones are rounded while most
columns are still free to absorb errors; the checkpoint's g_idx then records each column's group.
With static groups, act-order keeps groups of consecutive inputs (g_idx = j // group_size), their ranges
set from the weights before any update, so the checkpoint needs no input permutation.

Clip search shrinks each group's range by the factor, of a grid, that minimises the group's rounding error
weighted by its inputs' mean squares (GPTQ) or its exact output error over the calibration tokens, the
group's whole block of H (AWQ's round-to-nearest): a 4-bit grid spread over one outlier wastes most of its
levels.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..models.linear.cpu_paths import one_thread
from ..models.linear.quant_formats import IntWeight


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
    clip_search: bool = False  # shrink each group's range to the one with the least input-weighted error
    static_groups: bool = False  # act-order with input-order groups, ranges fixed before any update


# the clip grid: range shrink factors 1, 0.99, ..., 0.2 (as GPTQ's reference steps them)
CLIP_SHRINKS = torch.arange(100, 19, -1, dtype=torch.float64) / 100


def group_params(w: torch.Tensor, bits: int, sym: bool,
                 importance: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale [N], zero [N]) for the columns `w` [N, g], min-max over a range that includes 0 (as GPTQ's
    reference does). With `importance`, the range is shrunk by the factor of CLIP_SHRINKS that rounds each
    row with the least output error (output_error): err H err^T for the inputs' second moments H [g, g]
    (X^T X / tokens), or sum_j H_jj err_j^2 for their mean squares [g] alone. Weighing by the inputs matters: clipping by the weights' own
    error (GPTQ's reference with mse=True) cuts the few huge weights that read SmolLM2's huge activation
    channels, and took its RTN perplexity from 12.1 to 16.2. Scales are fp16-exact (as stored); zeros
    are kept in [1, 2**bits - 1] because the v1 GPTQ format stores zero - 1 unsigned."""
    lo, hi = w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0)
    if sym:
        hi = torch.maximum(-lo, hi)
        lo = -hi
    if importance is None:
        return _range_params(lo, hi, bits, sym)
    best_err = torch.full_like(lo, float("inf"))
    scale, zero = torch.empty_like(lo), torch.empty_like(lo)
    for shrink in CLIP_SHRINKS.tolist():
        s, z = _range_params(lo * shrink, hi * shrink, bits, sym)
        err = output_error(s[:, None] * (round_column(w, s[:, None], z[:, None], bits) - z[:, None]) - w, importance)
        better = err < best_err
        best_err = torch.where(better, err, best_err)
        scale, zero = torch.where(better, s, scale), torch.where(better, z, zero)
    return scale, zero


def output_error(diff: torch.Tensor, importance: torch.Tensor) -> torch.Tensor:
    """Each row's output error of the weight error `diff` [N, g] on inputs of second moment `importance`:
    diff H diff^T with H [g, g], or with only its diagonal [g] (the inputs taken as independent)."""
    return ((diff @ importance) * diff).sum(dim=1) if importance.dim() == 2 else diff.square() @ importance


def _range_params(lo: torch.Tensor, hi: torch.Tensor, bits: int, sym: bool) -> tuple[torch.Tensor, torch.Tensor]:
    maxq = 2**bits - 1
    scale = ((hi - lo) / maxq).half().to(lo.dtype)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.full_like(scale, (maxq + 1) // 2) if sym else torch.round(-lo / scale)
    return scale, zero.clamp(1, maxq)


def round_column(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, bits: int) -> torch.Tensor:
    return (torch.round(w / scale) + zero).clamp(0, 2**bits - 1)


def rtn_quantize(weight: torch.Tensor, spec: GPTQSpec, importance: torch.Tensor | None = None,
                 refit: bool = False) -> IntWeight:
    """Round-to-nearest with GPTQ's groups and parameters: the baseline GPTQ improves on. With
    `spec.clip_search`, `importance` (the inputs' second moments [K, K], or their mean squares [K])
    weighs the clip search. `refit` (AWQ's; asymmetric codes and a [K, K] `importance`): each group's scale
    and zero refitted to its codes on that output error (`refit_params`)."""
    if refit and (importance is None or importance.dim() != 2):
        raise ValueError("rtn_quantize: refit needs the inputs' second moments [K, K]")
    n, k = weight.shape
    gs = spec.group_size if spec.group_size > 0 else k
    w, groups = weight.float(), -(-k // gs)
    codes = torch.empty(n, k, dtype=torch.int32)
    scales, zeros = torch.empty(n, groups), torch.empty(n, groups)
    for g in range(groups):
        cols = slice(g * gs, min((g + 1) * gs, k))
        h = _clip(spec, importance, cols)
        scales[:, g], zeros[:, g] = group_params(w[:, cols], spec.bits, spec.sym, h)
        if refit and h is not None and not spec.sym:
            scales[:, g], zeros[:, g] = refit_params(w[:, cols], scales[:, g], zeros[:, g], h, spec.bits)
        codes[:, cols] = round_column(w[:, cols], scales[:, g:g + 1], zeros[:, g:g + 1], spec.bits).int()
    return IntWeight(codes, zeros.int(), scales.half(), torch.arange(k) // gs, spec.bits)


REFIT_STEPS = 3  # each step refits, and rounds again; 3 took AWQ's dev perplexity from 28.38 to 28.06


def refit_params(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, h: torch.Tensor,
                 bits: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's (scale, zero) of the group `w` [N, g] refitted to its codes c by least squares on the
    output error: w ~ a c + b with (a, b) minimising (w - a c - b) h (w - a c - b)^T (h [g, g]: the
    inputs' second moments), then scale = a (fp16), zero = round(-b / a) and the group rounded again; a
    row keeps the new pair only where its output error falls (the zero's rounding can undo the fit)."""
    maxq = 2**bits - 1

    def error(s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return output_error(s[:, None] * (round_column(w, s[:, None], z[:, None], bits) - z[:, None]) - w, h)

    best, wh, h1 = error(scale, zero), w @ h, h.sum(dim=0)
    for _ in range(REFIT_STEPS):
        c = round_column(w, scale[:, None], zero[:, None], bits)
        hc = c @ h
        cc, c1, ones = (hc * c).sum(dim=1), hc.sum(dim=1), h1.sum()  # the normal equations' matrix
        wc, w1 = (wh * c).sum(dim=1), wh.sum(dim=1)
        det = cc * ones - c1 * c1
        a, b = (wc * ones - w1 * c1) / det, (cc * w1 - c1 * wc) / det
        s = a.half().to(a.dtype)
        ok = (s > 0) & s.isfinite() & b.isfinite()
        s = torch.where(ok, s, scale)
        z = torch.where(ok, (-b / s).round().clamp(1, maxq), zero)
        err = error(s, z)
        better = ok & (err < best)
        best = torch.where(better, err, best)
        scale, zero = torch.where(better, s, scale), torch.where(better, z, zero)
    return scale, zero


def _clip(spec: GPTQSpec, importance: torch.Tensor | None, cols: slice | torch.Tensor) -> torch.Tensor | None:
    """The clip search's input weights for the group `cols`, or None for min-max ranges."""
    if not spec.clip_search or importance is None:
        return None
    return importance[cols][:, cols] if importance.dim() == 2 else importance[cols]


def dampened_hessian(hessian: torch.Tensor, weight: torch.Tensor, percdamp: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(H + percdamp * mean(diag H) * I, W) with dead inputs (diag 0: never active) given H_jj = 1, W_:j = 0."""
    h, w = hessian.clone(), weight.clone()
    dead = h.diagonal() == 0
    h[dead, dead] = 1
    w[:, dead] = 0
    h.diagonal().add_(percdamp * h.diagonal().mean())
    return h, w


def inverse_factor(h: torch.Tensor, percdamp: float) -> torch.Tensor:
    """The upper Cholesky factor of h^-1. Where h (dampened by `percdamp`) is numerically singular for its
    dtype, the dampening is raised tenfold until it factors, as AutoGPTQ's users do by hand."""
    extra = percdamp * h.diagonal().mean()
    while True:
        try:
            return torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
        except torch.linalg.LinAlgError:
            h = h + 9 * extra * torch.eye(len(h), dtype=h.dtype)
            extra = 10 * extra


def gptq_quantize(weight: torch.Tensor, hessian: torch.Tensor, spec: GPTQSpec) -> IntWeight:
    """weight [N, K], hessian [K, K] (computed in their dtype: fp32, or fp64 for a reference)."""
    with one_thread():  # thousands of tiny per-column ops
        return _gptq(weight, hessian, spec)


def _gptq(weight: torch.Tensor, hessian: torch.Tensor, spec: GPTQSpec) -> IntWeight:
    n, k = weight.shape
    gs = spec.group_size if spec.group_size > 0 else k
    if gs != k and spec.block_size % gs and gs % spec.block_size:
        raise ValueError(f"group_size {gs} and block_size {spec.block_size}: one must divide the other")
    h, w = dampened_hessian(hessian, weight, spec.percdamp)
    order = torch.argsort(h.diagonal(), descending=True) if spec.act_order else torch.arange(k)
    u = inverse_factor(h[order][:, order], spec.percdamp)
    # W transposed: column q of W is row q here, contiguous, so the per-column steps touch dense memory
    wt = w[:, order].T.contiguous()
    codes, errors = torch.empty_like(wt), torch.empty_like(wt)
    groups = -(-k // gs)  # the last group may be shorter (SmolLM2's 576 inputs in groups of 128)
    scales, zeros = torch.empty(groups, n, dtype=w.dtype), torch.empty(groups, n, dtype=w.dtype)
    # the inputs' mean squares, in input order. Not H's whole block of the group, nor GPTQ's own per-column
    # cost 1 / [H^-1]_qq: on the development text both rounded worse (docs/models.md)
    importance = hessian.diagonal() / 2
    static = spec.static_groups and spec.act_order
    if static:  # every group's range from the weights as they are, in input order
        for g in range(groups):
            span = slice(g * gs, (g + 1) * gs)
            scales[g], zeros[g] = group_params(w[:, span], spec.bits, spec.sym, _clip(spec, importance, span))
    group_of = order // gs if static else torch.arange(k) // gs  # by rounding position
    group_list = group_of.tolist()
    for b0 in range(0, k, spec.block_size):
        b1 = min(b0 + spec.block_size, k)
        for col in range(b0, b1):
            g = group_list[col]
            # a group's range, from its columns as all earlier columns' updates left them: a group starts
            # at a block's start (every earlier block's update applied) or inside one (in-block updates are)
            if not static and col % gs == 0:
                inputs = order[col:col + gs]  # the group's input indices (importance is in input order)
                scales[g], zeros[g] = group_params(wt[col:col + gs].T, spec.bits, spec.sym,
                                                   _clip(spec, importance, inputs))
            codes[col] = round_column(wt[col], scales[g], zeros[g], spec.bits)
            err = torch.div(wt[col] - scales[g] * (codes[col] - zeros[g]), u[col, col], out=errors[col])
            wt[col + 1:b1].addr_(u[col, col + 1:b1], err, alpha=-1)
        wt[b1:].addmm_(u[b0:b1, b1:].T, errors[b0:b1], alpha=-1)  # the block's errors reach later columns at once
    return _in_input_order(codes.T.int(), scales.T, zeros.T, order, group_of, spec.bits)


def _in_input_order(codes: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor, order: torch.Tensor,
                    group_of: torch.Tensor, bits: int) -> IntWeight:
    """Columns back in input order; g_idx[order[j]] = group_of[j] (the j-th column rounded is in that group)."""
    unsorted = torch.empty_like(codes)
    unsorted[:, order] = codes
    g_idx = torch.empty_like(group_of)
    g_idx[order] = group_of
    return IntWeight(unsorted, zeros.int(), scales.half(), g_idx, bits)
