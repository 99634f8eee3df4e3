"""GPTQ on one linear: against round-to-nearest on held-out inputs, and against a slow reference written
from the paper's equations (Optimal Brain Surgeon updates with an explicitly downdated inverse Hessian,
one column at a time, no Cholesky and no blocks)."""
from __future__ import annotations

import pytest
import torch

from radixlang.runtime.models.linear.quant_formats import write_gptq
from radixlang.runtime.quantize.driver import DAMPS, asymmetric_target, pick_damp
from radixlang.runtime.quantize.gptq import (
    CLIP_SHRINKS,
    GPTQSpec,
    dampened_hessian,
    gptq_quantize,
    group_params,
    inverse_factor,
    refit_params,
    round_column,
    rtn_quantize,
)

from ..models.quant_folders import gptq_reference_dequant, rtn_groups


def correlated_inputs(rows: int, k: int, seed: int) -> torch.Tensor:
    """Samples (by `seed`) of one distribution with correlated channels and a few large ones, as
    activations have."""
    mix = torch.randn(k, k, generator=torch.Generator().manual_seed(0)) / k**0.5 + torch.eye(k)
    x = torch.randn(rows, k, generator=torch.Generator().manual_seed(seed)) @ mix
    return x * (1 + 4 * (torch.arange(k) % 17 == 0))


def hessian(x: torch.Tensor) -> torch.Tensor:
    return 2 * x.T @ x / x.shape[0]


def paper_reference(weight: torch.Tensor, h: torch.Tensor, spec: GPTQSpec) -> torch.Tensor:
    """Codes [N, K] from the paper's equations: for each column q in turn, quantize it, then
    delta_F = -(w_q - quant(w_q)) / [H_F^-1]_qq * (H_F^-1)_{q,:} and
    H_{-q}^-1 = H^-1 - H^-1_{:,q} H^-1_{q,:} / [H^-1]_qq."""
    h, w = dampened_hessian(h, weight, spec.percdamp)
    n, k = w.shape
    gs = spec.group_size if spec.group_size > 0 else k
    order = torch.argsort(h.diagonal(), descending=True) if spec.act_order else torch.arange(k)
    hinv = torch.linalg.inv(h)
    codes = torch.zeros(n, k, dtype=torch.int32)
    for j, q in enumerate(order.tolist()):
        if j % gs == 0:  # a group is the next gs columns in the order they are rounded, as they are now
            scale, zero = group_params(w[:, order[j:j + gs]], spec.bits, spec.sym)
        code = (torch.round(w[:, q] / scale) + zero).clamp(0, 2**spec.bits - 1)
        codes[:, q] = code.int()
        err = (w[:, q] - scale * (code - zero)) / hinv[q, q]
        w = w - err[:, None] * hinv[q][None, :]
        hinv = hinv - torch.outer(hinv[:, q], hinv[q]) / hinv[q, q]
    return codes


@pytest.mark.parametrize("act_order", [False, True])
@pytest.mark.parametrize("group_size, block_size", [(32, 64), (64, 32), (-1, 64)])  # groups in blocks, across
def test_gptq_equals_the_papers_unblocked_equations(act_order, group_size, block_size):
    k = 128
    x = correlated_inputs(512, k, seed=0).double()
    w = torch.randn(24, k, generator=torch.Generator().manual_seed(3)).double()
    spec = GPTQSpec(bits=4, group_size=group_size, act_order=act_order, block_size=block_size)
    ours = gptq_quantize(w, hessian(x), spec)
    want = paper_reference(w, hessian(x), spec)
    assert torch.equal(ours.codes, want)
    assert ours.g_idx.bincount().tolist() == [k // ours.zeros.shape[1]] * ours.zeros.shape[1]


@pytest.mark.parametrize("bits, act_order", [(4, False), (4, True), (8, False)])
def test_gptq_output_error_is_below_round_to_nearest_on_held_out_inputs(bits, act_order):
    k = 256
    calib, held_out = correlated_inputs(1024, k, seed=5), correlated_inputs(256, k, seed=9)
    w = torch.randn(64, k, generator=torch.Generator().manual_seed(7)) / k**0.5
    spec = GPTQSpec(bits=bits, group_size=128, act_order=act_order)
    want = held_out @ w.T
    gptq_err = (held_out @ gptq_quantize(w, hessian(calib), spec).dequantize().T - want).pow(2).mean()
    codes, zeros, scales = rtn_groups(w, bits, 128, torch.arange(k) // 128)  # the test suite's own RTN
    rtn = scales.float().repeat_interleave(128, dim=1) * (codes - zeros.repeat_interleave(128, dim=1))
    rtn_err = (held_out @ rtn.T - want).pow(2).mean()
    print(f"bits {bits} act_order {act_order}: mse gptq {gptq_err:.3e} rtn {rtn_err:.3e}")
    assert gptq_err < 0.7 * rtn_err


def test_clip_search_lowers_output_error_below_round_to_nearest():
    """Shrinking a group's range trades clipping its extreme weights for finer steps everywhere else. Weighed
    by the inputs' mean squares, the search lowers RTN's and GPTQ's output error on heavy-tailed weights
    (as trained ones are), and it does shrink most groups."""
    k = 256
    torch.manual_seed(11)
    w = torch.distributions.StudentT(3.0).sample((64, k)) / k**0.5  # heavy tails: a few large weights per row
    calib, held_out = correlated_inputs(1024, k, seed=5), correlated_inputs(256, k, seed=9)
    h, want = hessian(calib), held_out @ w.T

    def error(q) -> float:
        return (held_out @ q.dequantize().T - want).pow(2).mean().item()

    plain, clipped = GPTQSpec(group_size=128), GPTQSpec(group_size=128, clip_search=True)
    rtn, rtn_clip = error(rtn_quantize(w, plain)), error(rtn_quantize(w, clipped, importance=h.diagonal() / 2))
    gptq, gptq_clip = error(gptq_quantize(w, h, plain)), error(gptq_quantize(w, h, clipped))
    print(f"output mse: rtn {rtn:.4f} clipped {rtn_clip:.4f}; gptq {gptq:.4f} clipped {gptq_clip:.4f}")
    assert rtn_clip < 0.95 * rtn and gptq_clip < 0.95 * gptq < rtn
    full_range = group_params(w[:, :128], 4, False)[0]
    assert (group_params(w[:, :128], 4, False, h.diagonal()[:128])[0] < full_range).float().mean() > 0.5


def test_clip_search_picks_the_range_with_the_least_exact_output_error():
    """Brute force over the shrink grid, each rounding's output error ||X (w - q)^T||^2 computed from the
    inputs X themselves: the range the search picks from H = X^T X (off-diagonal terms included) has
    each row's least error."""
    x = correlated_inputs(512, 32, seed=3).double()
    w = torch.distributions.StudentT(3.0).sample((64, 32)).double()
    lo, hi = w.amin(dim=1).clamp(max=0), w.amax(dim=1).clamp(min=0)

    def rounded(scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
        scale, zero = scale[:, None], zero[:, None]
        return scale * ((w / scale).round() + zero).clamp(0, 15).sub(zero)

    def exact_error(q: torch.Tensor) -> torch.Tensor:
        return (x @ (w - q).T).square().sum(dim=0)

    grid = []
    for shrink in CLIP_SHRINKS.tolist():  # min-max over the shrunk range, fp16 scales, zeros in [1, 15]
        scale = ((hi - lo) * shrink / 15).half().double()
        grid.append(exact_error(rounded(scale, (-lo * shrink / scale).round().clamp(1, 15))))
    best = torch.stack(grid).min(dim=0).values
    assert torch.allclose(exact_error(rounded(*group_params(w, 4, False, x.T @ x))), best, rtol=1e-9)


def test_refit_is_the_least_squares_fit_of_scale_and_zero_to_the_codes_from_the_inputs(monkeypatch):
    """One refit step against least squares solved on the inputs X themselves (torch.linalg.lstsq of
    X w ~ a X c + b X 1 per row): the scale a in fp16, the zero -b / a rounded, kept where the exact
    output error falls; and it falls in all."""
    monkeypatch.setattr("radixlang.runtime.quantize.gptq.REFIT_STEPS", 1)
    x = correlated_inputs(512, 32, seed=4).double()
    w = torch.distributions.StudentT(3.0).sample((64, 32)).double()
    h = x.T @ x
    scale, zero = group_params(w, 4, False, h)
    got = refit_params(w, scale, zero, h, 4)

    def exact_error(s: torch.Tensor, z: torch.Tensor) -> torch.Tensor:
        return (x @ (w - s[:, None] * (round_column(w, s[:, None], z[:, None], 4) - z[:, None])).T).square().sum(dim=0)

    want_s, want_z = scale.clone(), zero.clone()
    before = exact_error(scale, zero)
    for row in range(len(w)):
        codes = round_column(w[row:row + 1], scale[row], zero[row], 4)[0]
        basis = torch.stack([x @ codes, x.sum(dim=1)], dim=1)
        a, b = torch.linalg.lstsq(basis, (x @ w[row])[:, None]).solution[:, 0].tolist()
        s = torch.tensor([a]).half().double()
        z = (-b / s).round().clamp(1, 15)
        w_row = w[row:row + 1]
        new = (x @ (w_row - s * (round_column(w_row, s, z, 4) - z)).T).square().sum()
        if new < before[row]:
            want_s[row], want_z[row] = s, z
    assert torch.equal(got[0], want_s) and torch.equal(got[1], want_z)
    after = exact_error(*got)
    assert (after <= before).all() and after.sum() < 0.98 * before.sum()


@pytest.mark.parametrize("clip_search", [False, True])
def test_static_groups_keep_input_order_groups_and_stay_below_round_to_nearest(clip_search):
    k = 256
    calib, held_out = correlated_inputs(1024, k, seed=5), correlated_inputs(256, k, seed=9)
    w = torch.randn(64, k, generator=torch.Generator().manual_seed(7)) / k**0.5
    spec = GPTQSpec(group_size=128, act_order=True, static_groups=True, clip_search=clip_search)
    q = gptq_quantize(w, hessian(calib), spec)
    assert torch.equal(q.g_idx, torch.arange(k) // 128)  # no input permutation at load
    want = held_out @ w.T
    err = (held_out @ q.dequantize().T - want).pow(2).mean()
    assert err < 0.7 * (held_out @ rtn_quantize(w, GPTQSpec()).dequantize().T - want).pow(2).mean()


def test_act_order_codes_round_trip_through_the_gptq_format_and_its_permutation():
    """An act-order checkpoint's g_idx records each input's group: AutoGPTQ's formula reads back exactly our
    weights, and the loader's sort by group (inputs gathered in that order) computes the same product."""
    k = 256
    x = correlated_inputs(512, k, seed=1)
    w = torch.randn(32, k, generator=torch.Generator().manual_seed(2))
    q = gptq_quantize(w, hessian(x), GPTQSpec(group_size=32, act_order=True))
    assert not torch.equal(q.g_idx, torch.arange(k) // 32)  # permuted: the groups are not input runs
    assert q.g_idx.bincount().tolist() == [32] * (k // 32)
    assert torch.equal(gptq_reference_dequant(write_gptq(q, zero_offset=1), 4, torch.float32), q.dequantize())
    ordered, order = q.sorted_by_group()
    assert torch.equal(ordered.g_idx, torch.arange(k) // 32)
    assert torch.allclose(x[:, order] @ ordered.dequantize().T, x @ q.dequantize().T, atol=1e-4)


def test_a_singular_hessian_is_dampened_until_it_factors():
    """A rank-1 H (one calibration direction) in fp32 with a negligible dampening: Cholesky fails, and the
    dampening is raised until it succeeds; the result is H^-1's upper factor of the dampened H."""
    v = torch.randn(64, generator=torch.Generator().manual_seed(0)) * 1e3
    h = torch.outer(v, v)
    with pytest.raises(torch.linalg.LinAlgError):
        torch.linalg.cholesky(h + 1e-9 * h.diagonal().mean() * torch.eye(64))
    u = inverse_factor(h + 1e-9 * h.diagonal().mean() * torch.eye(64), 1e-9)
    assert torch.isfinite(u).all() and torch.equal(u, u.triu())


def test_held_out_samples_pick_a_dampening_that_generalises():
    """Too few calibration rows (48 for 128 inputs) leave H singular but for the dampening: the paper's
    small one fits those rows and rounds every other direction badly. Held-out rows of the same
    distribution catch it, and the dampening they pick does better on new inputs."""
    k = 128
    fit, held_out, new = correlated_inputs(48, k, seed=5), correlated_inputs(256, k, seed=6), correlated_inputs(256, k, seed=9)
    w = torch.randn(32, k, generator=torch.Generator().manual_seed(7)) / k**0.5
    damp = pick_damp(w, hessian(fit), hessian(held_out), GPTQSpec(group_size=32, act_order=True))

    def new_error(d: float) -> float:
        q = gptq_quantize(w, hessian(fit), GPTQSpec(group_size=32, act_order=True, percdamp=d))
        return (new @ (q.dequantize() - w).T).pow(2).mean().item()

    errors = {d: new_error(d) for d in DAMPS}
    print(f"picked {damp}; error on new inputs by dampening {errors}")
    assert damp > DAMPS[0] and errors[damp] < errors[DAMPS[0]]


def test_asymmetric_target_is_the_ridge_least_squares_fit_and_lowers_gptqs_error_on_the_fp_outputs():
    """GPTAQ: the quantized model's inputs X_q drift from the fp model's X_fp. The target W* is the ridge
    least-squares fit (oracle: lstsq on the stacked system, float64) of the fp outputs X_fp W^T from X_q,
    and GPTQ of W* has a lower error on the fp outputs than GPTQ of W (the symmetric objective)."""
    k, n, rows = 128, 32, 512
    x_fp = correlated_inputs(rows, k, seed=3).double()
    x_q = x_fp + 0.3 * correlated_inputs(rows, k, seed=4).double()
    w = torch.randn(n, k, generator=torch.Generator().manual_seed(8), dtype=torch.float64) / k**0.5
    h, cross, percdamp = hessian(x_q), 2 * x_fp.T @ x_q / rows, 0.1
    d = percdamp * h.diagonal().mean()
    stacked = torch.cat([(2 / rows) ** 0.5 * x_q, d**0.5 * torch.eye(k, dtype=torch.float64)])
    goal = torch.cat([(2 / rows) ** 0.5 * x_fp @ w.T, d**0.5 * w.T])
    fit = torch.linalg.lstsq(stacked, goal).solution.T
    torch.testing.assert_close(asymmetric_target(w, h, cross, percdamp), fit)
    torch.testing.assert_close(asymmetric_target(w, h, cross, percdamp, beta=0.5), (w + fit) / 2)

    spec = GPTQSpec(group_size=32, act_order=True, percdamp=percdamp)

    def fp_error(weight: torch.Tensor) -> float:
        return (x_fp @ w.T - x_q @ gptq_quantize(weight, h, spec).dequantize().double().T).pow(2).mean().item()

    symmetric, asymmetric = fp_error(w), fp_error(asymmetric_target(w, h, cross, percdamp))
    print(f"error on the fp outputs: symmetric {symmetric:.4g}, asymmetric {asymmetric:.4g}")
    assert asymmetric < 0.8 * symmetric
