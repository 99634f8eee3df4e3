"""The native block kernel (`torch.ops.radixlang_cpu.block_mm`, block_kernel.py) against a brute-force oracle in
torch: the weights as the `gguf` package dequantizes the file's blocks, the activations quantized per 32 by the
kernel's documented rule (block_mm.cpp), an fp64 matmul. Also: torch.compile traces it as one op with the same
results, and without the kernel a GGUF's low-bit linears fall back to torch's int4pack."""
from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from radixlang.kernels.cpu import block_kernel
from radixlang.kernels.cpu.gguf_blocks import read_blocks
from radixlang.runtime.models.linear import quant
from radixlang.runtime.models.linear.quant import BlockLinear, Int4Linear

from .gguf_tiny import Q

pytestmark = pytest.mark.skipif(not block_kernel.available(wait=True), reason="no AVX2 CPU or no C++ compiler")


def quantize_activations(x: torch.Tensor) -> torch.Tensor:
    """The activations the kernel computes with: per row and block of 32, q = round_half_even(x * 127 / amax)
    times amax / 127 (fp32, as the kernel computes the factor)."""
    rows, cols = x.shape
    blocks = x.view(rows, cols // 32, 32)
    amax = blocks.abs().amax(dim=-1, keepdim=True)
    factor = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros_like(amax))
    return (torch.round(blocks * factor) * (amax / 127.0)).view(rows, cols)


def file_blocks(qtype, rows: int, cols: int, seed: int) -> tuple[np.ndarray, torch.Tensor]:
    w = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.1 + 0.02
    raw = gguf.quants.quantize(w, qtype)
    return raw, torch.from_numpy(gguf.quants.dequantize(raw, qtype).reshape(rows, cols).astype(np.float64))


INTERLEAVED = block_kernel.interleave() > 0  # this CPU's build runs the interleaved layout (AVX-512 VNNI)
# N = 37: the rows layout (odd N, every CPU); N = 48: three interleaved groups where the build has that layout
LAYOUTS = [37, pytest.param(48, marks=pytest.mark.skipif(not INTERLEAVED, reason="no AVX-512 VNNI"))]


@pytest.mark.parametrize("n", LAYOUTS, ids=["rows", "interleaved"])
@pytest.mark.parametrize("qtype", [Q.Q4_0, Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_block_mm_is_the_files_weights_times_the_quantized_activations(qtype, n, monkeypatch):
    monkeypatch.setattr(quant, "DENSE_MIN_ROWS", 1 << 30)  # the kernel at every row count
    k = 160  # K = 5 blocks
    raw, weight = file_blocks(qtype, n, k, seed=0)
    layer = BlockLinear(read_blocks(raw, qtype, (n, k)), None)
    assert layer.qweight.dim() == (3 if n % 16 == 0 and INTERLEAVED else 2)
    g = torch.Generator().manual_seed(1)
    for rows in [*range(1, 10), 15, 16, 17, 31, 33, 40]:  # every tail of the 4- and 8-row tiles, and many tiles
        x = torch.randn(rows, k, generator=g) * torch.rand(rows, 1, generator=g) * 3
        x[0, 32:64] = 0  # a block of zeros: scale 0
        want = quantize_activations(x).double() @ weight.T
        got = layer(x)
        assert got.shape == (rows, n) and got.dtype == torch.float32
        # exact integer block sums; fp32 scale products and accumulation
        bound = 1e-5 * (quantize_activations(x).abs().double() @ weight.abs().T) + 1e-6
        assert ((got.double() - want).abs() <= bound).all(), (rows, (got.double() - want).abs().max())


@pytest.mark.parametrize("n", [5, 16], ids=["rows", "interleaved"])
def test_block_mm_extremes_of_the_codes_and_the_activations(n):
    """Q8_0 codes of -128 and 127 against activations of +-127: the largest products; 4-bit codes 0 and 15."""
    k = 64
    codes = torch.tensor([-128, 127] * (n * k // 2), dtype=torch.int16).view(n, k)
    scale, minimum = torch.full((n, 2), 0.5), torch.zeros(n, 2)
    x = torch.tensor([1.0, -1.0] * (k // 2)).repeat(3, 1) * torch.tensor([[1.0], [-2.0], [0.25]])
    want = quantize_activations(x).double() @ (codes.double() * 0.5).T
    eight = quant.GroupQuant(codes, scale, minimum, bits=8)
    got = torch.ops.radixlang_cpu.block_mm(x, *block_kernel.block_operands(eight), 8)
    assert torch.allclose(got.double(), want, rtol=1e-6)
    four = quant.GroupQuant((codes > 0).to(torch.int16) * 15, scale, minimum - 3.0, bits=4)
    got = torch.ops.radixlang_cpu.block_mm(x, *block_kernel.block_operands(four), 4)
    assert torch.allclose(got.double(), quantize_activations(x).double() @ four.dequantize().double().T, rtol=1e-6)


def test_block_mm_refuses_bad_operands():
    x, w = torch.randn(2, 64), quant.GroupQuant(torch.zeros(3, 64, dtype=torch.int16), torch.ones(3, 2),
                                                torch.zeros(3, 2), bits=4)
    qweight, scale, minimum = block_kernel.block_operands(w)
    with pytest.raises(RuntimeError, match="multiple of 32"):
        torch.ops.radixlang_cpu.block_mm(torch.randn(2, 48), qweight, scale, minimum, 4)
    with pytest.raises(RuntimeError, match="bits must be 4 or 8"):
        torch.ops.radixlang_cpu.block_mm(x, qweight, scale, minimum, 5)
    with pytest.raises(RuntimeError, match="qweight"):
        torch.ops.radixlang_cpu.block_mm(x, qweight[:, :16], scale, minimum, 4)
    if INTERLEAVED:  # a group's operands of the wrong kind
        qweight, scale, minimum = block_kernel.block_operands(quant.GroupQuant(
            torch.zeros(16, 64, dtype=torch.int16), torch.ones(16, 2), torch.zeros(16, 2), bits=8))
        assert qweight.dim() == 3
        with pytest.raises(RuntimeError, match="int16"):
            torch.ops.radixlang_cpu.block_mm(x, qweight, scale, minimum.float(), 8)
        with pytest.raises(RuntimeError, match="qweight"):
            torch.ops.radixlang_cpu.block_mm(x, qweight, scale, minimum, 4)


def test_compiled_block_linear_equals_eager(monkeypatch):
    monkeypatch.setattr(quant, "DENSE_MIN_ROWS", 1 << 30)
    raw, _ = file_blocks(Q.Q4_1, 48, 96, seed=2)
    layer = BlockLinear(read_blocks(raw, Q.Q4_1, (48, 96)), torch.randn(48))
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)  # one opaque op: no graph break
    for rows in (1, 3):
        x = torch.randn(rows, 96)
        assert torch.equal(compiled(x), layer(x))


def test_without_the_kernel_gguf_linears_fall_back_to_int4pack(monkeypatch):
    monkeypatch.setenv("RADIXLANG_BLOCK_KERNEL", "0")
    raw, weight = file_blocks(Q.Q4_1, 48, 96, seed=3)
    blocks = read_blocks(raw, Q.Q4_1, (48, 96))
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(96, 48, bias=False)
    assert quant.quantize_model(model, "auto", {"proj.weight": blocks}) == 1
    assert type(model.proj) is Int4Linear and not hasattr(model.proj, "qweight")
    x = torch.randn(2, 96)
    xb = x.to(torch.bfloat16).double()
    want = xb @ weight.T
    assert ((model.proj(x).double() - want).abs() <= 2**-7 * (xb.abs() @ weight.abs().T) + 1e-5).all()
    # a BlockLinear from a weight cache entry, where the kernel is gone: its dense copy at every row count
    record = quant.packed_linear_record(BlockLinear(blocks, None))
    state = dict(BlockLinear(blocks, None).state_dict())
    restored = quant.packed_linear_from_state(record, state)
    assert type(restored) is BlockLinear and restored.dense_min_rows == 1
    # the dense copy is bf16 where the CPU has bf16 units (cpu_paths), fp32 elsewhere
    xd = x.to(restored.dense.dtype).double()
    rounding = 2**-7 if restored.dense.dtype == torch.bfloat16 else 2**-20
    assert ((restored(x).double() - xd @ weight.T).abs() <= rounding * (xd.abs() @ weight.abs().T) + 1e-5).all()


def test_an_int4pack_entry_that_kept_its_blocks_loads_as_block_linear(monkeypatch):
    raw, weight = file_blocks(Q.Q8_0, 48, 96, seed=4)
    monkeypatch.setenv("RADIXLANG_BLOCK_KERNEL", "0")  # written while the kernel was building
    pending = Int4Linear(read_blocks(raw, Q.Q8_0, (48, 96)), None, keep_blocks=True)
    record, state = quant.packed_linear_record(pending), dict(pending.state_dict())
    monkeypatch.delenv("RADIXLANG_BLOCK_KERNEL")
    restored = quant.packed_linear_from_state(record, state)
    assert type(restored) is BlockLinear and restored.bits == 8
    assert dict(restored.state_dict()).keys() == state.keys()  # the entry's keys load strictly
    x = torch.randn(2, 96)
    assert torch.allclose(restored(x).double(), quantize_activations(x).double() @ weight.T, atol=1e-5)


def test_the_build_is_cached_by_source_and_lands_atomically(tmp_path, monkeypatch):
    monkeypatch.setenv("RADIXLANG_KERNEL_DIR", str(tmp_path))
    block_kernel.library_path.cache_clear()
    try:
        path = block_kernel.library_path()
        assert path.parent == tmp_path and path.name.startswith("block_mm-") and path.suffix == ".so"
        monkeypatch.setenv("CXX", "/nonexistent/g++")
        with pytest.raises((OSError, RuntimeError)):
            block_kernel.build(path)
        assert list(tmp_path.iterdir()) == []  # no partial file left behind
    finally:
        block_kernel.library_path.cache_clear()


RUNS_ON_TORCH_THREADS = r"""
import os, numpy as np, torch
from radixlang.kernels.cpu import block_kernel
assert block_kernel.available(wait=True)
torch.set_num_threads(2)
rng = np.random.default_rng(0)  # operands from numpy: no torch op has started a parallel region before the kernel
x = torch.from_numpy(rng.standard_normal((1, 1024), dtype=np.float32))
qweight = torch.from_numpy(rng.integers(0, 256, (4096, 512), dtype=np.uint8))
scale = torch.from_numpy(np.full((4096, 32), 0.01, dtype=np.float32))
threads = len(os.listdir("/proc/self/task"))
torch.ops.radixlang_cpu.block_mm(x, qweight, scale, scale, 4)
print(len(os.listdir("/proc/self/task")) - threads)
"""


def test_block_mm_runs_on_torchs_threads():
    """The op's parallel_for starts torch's OpenMP workers: built without -fopenmp, ATen's header-only OpenMP
    parallel_for ran the whole matmul on the calling thread."""
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-c", RUNS_ON_TORCH_THREADS], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split()[-1] == "1"  # one worker beside the calling thread


@pytest.mark.parametrize("n", LAYOUTS, ids=["rows", "interleaved"])
@pytest.mark.parametrize("qtype", [Q.Q4_1, Q.Q8_0], ids=lambda q: q.name)
def test_a_rows_result_does_not_depend_on_the_rows_beside_it(qtype, n):
    """Issue 43: a BlockLinear computes a row bitwise the same alone, in a batch of 7 and in a prefill of 600 rows
    (it ran a dense copy from ~20 rows on before, and a cached prompt's answer changed)."""
    k = 96
    raw, _ = file_blocks(qtype, n, k, seed=2)
    layer = BlockLinear(read_blocks(raw, qtype, (n, k)), None)
    x = torch.randn(600, k, generator=torch.Generator().manual_seed(3))
    alone = layer(x[5:6])
    for rows in (7, 600):
        assert torch.equal(layer(x[:rows])[5:6], alone), rows


def test_attention_rows_is_softmax_attention_and_each_rows_own():
    """radixlang_cpu::attention_rows against an fp64 oracle (softmax(q k^T * scale) v over each row's visible
    keys, grouped-query heads), and bitwise the same for a row whatever the call: a whole causal prefill, an
    extend over a cached prefix, one decode, a decode batch beside longer sequences."""
    g = torch.Generator().manual_seed(4)
    heads, kv_heads, d, slots_total = 6, 2, 24, 300
    k_cache, v_cache = (torch.randn(slots_total, kv_heads, d, generator=g) for _ in range(2))
    slots = torch.randperm(slots_total, generator=g)[:70]
    q = torch.randn(70, heads, d, generator=g)
    op = torch.ops.radixlang_cpu.attention_rows

    def run(rows: torch.Tensor, slot_list: torch.Tensor, offsets: list[int], lengths: list[int]) -> torch.Tensor:
        return op(rows, k_cache, v_cache, slot_list, torch.tensor(offsets), torch.tensor(lengths), 0.3)

    prefill = run(q, slots, [0] * 70, list(range(1, 71)))
    keys, values = k_cache[slots].double(), v_cache[slots].double()
    for r in (0, 9, 69):
        for h in range(heads):
            p = torch.softmax(keys[: r + 1, h // 3] @ q[r, h].double() * 0.3, 0)
            assert torch.allclose(prefill[r, h].double(), p @ values[: r + 1, h // 3], atol=1e-5)
    extend = run(q[40:], slots, [0] * 30, list(range(41, 71)))  # 40 tokens cached, 30 new
    decode = run(q[69:], slots, [0], [70])
    other = torch.randperm(slots_total, generator=g)[:200]  # a longer neighbour's slots first
    batch = run(torch.cat([q[:1], q[69:]]), torch.cat([other, slots]), [0, 200], [200, 70])
    assert torch.equal(extend, prefill[40:]) and torch.equal(decode, prefill[69:]) and torch.equal(batch[1:], decode)
