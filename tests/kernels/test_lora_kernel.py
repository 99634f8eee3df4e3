"""The gathered LoRA delta (kernels/lora.py): each row gets B[s] A[s] x of its own slot (an fp64 per-row oracle),
base rows nothing; a row's delta is the same bits alone and in any batch (more rows of its adapter than one tile,
other adapters, base rows beside it), for the CPU's tiles and CUDA's; the Triton kernel (under TRITON_INTERPRET=1 on a CPU) equals the torch path.
The native CPU kernel (kernels/cpu/lora_mm.cpp) against the same fp64 oracle, in fp32, bf16 and int8 weights (the
oracle on the dequantized codes), with fused targets (their column bounds), and its per-row bits alone and in any
batch. The embedding's delta (a row's rank activations gathered by token id) against the same oracle, and its
per-row bits alone and in any batch."""
from __future__ import annotations

import functools

import pytest
import torch

from radixlang.kernels.lora import (
    TILE,
    lora_delta_cpu,
    lora_delta_torch,
    lora_embedding_torch,
    native_available,
    plan_rows,
    quantize_rows,
)
from radixlang.kernels.registry import ATTENTION_BACKENDS

CPU = torch.device("cpu")
K, N, R, SLOTS = 40, 24, 12, 4  # odd sizes: partial blocks in the Triton kernel


def weights(dtype: torch.dtype = torch.float32) -> tuple[torch.Tensor, torch.Tensor]:
    """A [slots, R, K] and B^T [slots, R, N], as the pool stacks them."""
    g = torch.Generator().manual_seed(0)
    a, bt = torch.randn(SLOTS, R, K, generator=g), torch.randn(SLOTS, R, N, generator=g)
    a[0], bt[0] = 0, 0  # slot 0: the base model
    return a.to(dtype), bt.to(dtype)


def run(x: torch.Tensor, slots: list[int], a: torch.Tensor, b: torch.Tensor, tile: int | None = None) -> torch.Tensor:
    y = torch.zeros(len(slots), N, dtype=x.dtype)
    plan = plan_rows(slots, CPU, tile)
    return y if plan is None else lora_delta_torch(y, x, a, b, plan)


def test_each_row_gets_its_own_adapters_delta():
    a, b = weights()
    slots = [1, 0, 2, 1, 3, 0] + [2] * (TILE + 3)  # a slot with more rows than one tile
    x = torch.randn(len(slots), K, generator=torch.Generator().manual_seed(1))
    got = run(x, slots, a, b)
    want = torch.stack([b[s].double().T @ (a[s].double() @ row.double()) for s, row in zip(slots, x)])
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert not got[[1, 5]].any()  # base rows: no delta
    assert plan_rows([0, 0], CPU) is None


@pytest.mark.parametrize("tile", [None, TILE])
def test_a_rows_delta_is_the_same_bits_alone_and_in_any_batch(tile):
    a, b = weights()
    g = torch.Generator().manual_seed(2)
    row = torch.randn(1, K, generator=g)
    alone = run(row, [2], a, b, tile)[0]
    for others in ([1, 0, 3], [2] * (2 * TILE), [0] * 5 + [2] * 7, [3] * TILE):
        x = torch.cat([torch.randn(len(others), K, generator=g), row])
        mixed = run(x, others + [2], a, b, tile)[-1]
        assert torch.equal(mixed, alone), others


@pytest.mark.parametrize("tile", [None, TILE])
def test_the_embedding_delta_gathers_each_rows_token_column(tile):
    vocab = 50
    g = torch.Generator().manual_seed(5)
    a_t, bt = torch.randn(SLOTS, vocab, R, generator=g), torch.randn(SLOTS, R, N, generator=g)  # A^T: a row per token

    def embed(ids: list[int], slots: list[int]) -> torch.Tensor:
        y = torch.ones(len(ids), N)
        plan = plan_rows(slots, CPU, tile)
        assert plan is not None
        return lora_embedding_torch(y, torch.tensor(ids), a_t, bt, plan)

    ids, slots = [3, 7, 3, 49, 0] + [11] * (TILE + 2), [1, 2, 0, 2, 3] + [1] * (TILE + 2)
    got = embed(ids, slots)
    want = torch.stack([1 + (bt[s].double().T @ a_t[s, t].double() if s else torch.zeros(N, dtype=torch.float64))
                        for t, s in zip(ids, slots)])
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)
    assert torch.equal(got[2], torch.ones(N))  # a base row is left as it was
    alone = embed([49], [2])[0]
    for others in ([1, 0, 3], [2] * (2 * TILE), [0] * 5 + [2] * 7):
        assert torch.equal(embed([5] * len(others) + [49], others + [2])[-1], alone), others


@pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")
@pytest.mark.parametrize(("dtype", "y_dtype"), [(torch.float32, None), (torch.bfloat16, None),
                                              (torch.bfloat16, torch.float32)])  # the last: the LM head's logits
def test_the_triton_kernel_equals_the_torch_path(dtype, y_dtype):
    from radixlang.kernels.triton.lora import lora_delta_triton

    a, b = weights(dtype)
    slots = [1, 0, 2, 2, 3] + [1] * (TILE + 1)
    x = torch.randn(len(slots), K, generator=torch.Generator().manual_seed(3)).to(dtype)
    y = torch.randn(len(slots), N, generator=torch.Generator().manual_seed(4)).to(y_dtype or dtype)
    plan = plan_rows(slots, CPU, TILE)  # the CUDA tiles
    assert plan is not None
    want = lora_delta_torch(y.clone(), x, a, b, plan)
    got = lora_delta_triton(y.clone(), x, a, b, plan)
    tol = 1e-5 if dtype == torch.float32 else 3e-2
    torch.testing.assert_close(got.float(), want.float(), rtol=tol, atol=tol * 10)
    assert torch.equal(got[1], y[1])  # a base row is left as it was


# three fused targets (q | k | v-like): rank rows [g R, g R + R) feed columns [COLUMNS[g], COLUMNS[g + 1]); odd
# sizes for the kernel's partial vectors and row tiles
FUSED_R, COLUMNS = 5, [0, 37, 50, 83]
needs_native = pytest.mark.skipif(not native_available(), reason="the block kernel's library is not built")


def fused_weights(dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """A [slots, 3 R, K] and the block-diagonal B^T [slots, 3 R, N], as the pool stacks q, k and v (int8: fp32
    weights whose rows quantize_rows holds exactly)."""
    g = torch.Generator().manual_seed(5)
    a = torch.randn(SLOTS, 3 * FUSED_R, K, generator=g)
    bt = torch.zeros(SLOTS, 3 * FUSED_R, COLUMNS[-1])
    for j in range(3):
        rows, cols = slice(j * FUSED_R, (j + 1) * FUSED_R), slice(COLUMNS[j], COLUMNS[j + 1])
        bt[:, rows, cols] = torch.randn(SLOTS, FUSED_R, COLUMNS[j + 1] - COLUMNS[j], generator=g)
    a[:, -1] = 0  # a padded rank row
    return (a, bt) if dtype == torch.int8 else (a.to(dtype), bt.to(dtype))


def native(y: torch.Tensor, x: torch.Tensor, slots: list[int], a: torch.Tensor, b: torch.Tensor,
           int8: bool = False) -> torch.Tensor:
    rows = torch.tensor(slots, dtype=torch.int64)
    if not int8:
        return lora_delta_cpu(y.clone(), x, a, b, rows, COLUMNS)
    (qa, sa), (qb, sb) = quantize_rows(a), quantize_rows(b)
    return lora_delta_cpu(y.clone(), x, qa, qb, rows, COLUMNS, (sa, sb))


def test_quantize_rows_rounds_each_row_to_127_steps_of_its_absmax():
    w = torch.tensor([[1.0, -0.5, 0.25], [0.0, 0.0, 0.0], [-2.0, 1.0, 0.003]])
    codes, scale = quantize_rows(w)
    assert codes.tolist() == [[127, -64, 32], [0, 0, 0], [-127, 64, 0]]  # -63.5 rounds to even
    torch.testing.assert_close(scale, torch.tensor([1 / 127, 0.0, 2 / 127]))


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int8])
def test_the_native_kernel_adds_each_rows_own_adapters_delta(dtype):
    a, b = fused_weights(dtype)
    slots = [1, 0, 2, 1, 3, 0] + [2] * 21  # a slot with more rows than one work item (16)
    g = torch.Generator().manual_seed(6)
    x, y = torch.randn(len(slots), K, generator=g), torch.randn(len(slots), COLUMNS[-1], generator=g)
    got = native(y, x, slots, a, b, int8=dtype == torch.int8)
    if dtype == torch.int8:  # the oracle computes with the weights the codes hold
        (qa, sa), (qb, sb) = quantize_rows(a), quantize_rows(b)
        a, b = qa.float() * sa[..., None], qb.float() * sb[..., None]
    want = torch.stack([y[t].double() + (b[s].double().T @ (a[s].double() @ x[t].double()) if s else 0)
                        for t, s in enumerate(slots)])
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-4)
    assert torch.equal(got[[1, 5]], y[[1, 5]])  # base rows: untouched


@needs_native
@pytest.mark.parametrize("dtype", [torch.float32, torch.int8])
def test_the_native_kernels_row_is_the_same_bits_alone_and_in_any_batch(dtype):
    a, b = fused_weights(dtype)
    native_ = functools.partial(native, int8=dtype == torch.int8)
    g = torch.Generator().manual_seed(7)
    row, y_row = torch.randn(1, K, generator=g), torch.randn(1, COLUMNS[-1], generator=g)
    alone = native_(y_row, row, [2], a, b)[0]
    for others in ([1, 0, 3], [2] * 40, [0] * 5 + [2] * 7, [3] * 17):
        x = torch.cat([torch.randn(len(others), K, generator=g), row])
        y = torch.cat([torch.randn(len(others), COLUMNS[-1], generator=g), y_row])
        assert torch.equal(native_(y, x, others + [2], a, b)[-1], alone), others
