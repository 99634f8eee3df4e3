"""The dense copy's matmul on its oneDNN-packed weight (prepacked.py): bit-equal to the plain bf16 matmul it
replaces, within bf16 rounding of an fp64 matmul, traced by torch.compile as one opaque op, and not saved."""
from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from radixlang.kernels.cpu import prepacked
from radixlang.kernels.cpu.gguf_blocks import GroupQuant
from radixlang.runtime.models.linear import quant
from radixlang.runtime.models.linear.quant import BlockLinear, Int4Linear

pytestmark = pytest.mark.skipif(prepacked.pack(torch.zeros(16, 32, dtype=torch.bfloat16)) is None,
                                reason="no bf16 units (the dense copies are fp32 and stay plain) or no mkldnn")


def test_the_packed_matmul_is_the_plain_matmul():
    g = torch.Generator().manual_seed(0)
    weight = (torch.randn(96, 160, generator=g) * 0.1).to(torch.bfloat16)
    packed = prepacked.pack(weight)
    assert packed is not None and packed.layout == torch._mkldnn
    for rows in (1, 7, 33, 300):
        x = torch.randn(rows, 160, generator=g)
        got = prepacked.dense_matmul(x, weight, packed)
        assert got.dtype == torch.bfloat16 and got.shape == (rows, 96)
        assert torch.equal(got, x.to(torch.bfloat16) @ weight.T)
        xd = x.to(torch.bfloat16).double()
        exact = xd @ weight.double().T  # bf16 output rounding, fp32 accumulation
        assert ((got.double() - exact).abs() <= 2**-8 * (xd.abs() @ weight.double().abs().T) + 1e-6).all()


def test_fp32_copies_stay_plain():
    assert prepacked.pack(torch.zeros(16, 32)) is None


@pytest.mark.parametrize("cls", [BlockLinear, Int4Linear])
def test_a_layers_dense_path_runs_packed_compiles_as_one_op_and_is_not_saved(cls, monkeypatch):
    monkeypatch.setattr(quant, "DENSE_MIN_ROWS", 4)
    monkeypatch.setattr(quant, "DENSE_DTYPE", torch.bfloat16)
    g = torch.Generator().manual_seed(1)
    codes = torch.randint(0, 16, (48, 96), dtype=torch.int16, generator=g)
    blocks = GroupQuant(codes, torch.rand(48, 3, generator=g) * 0.01, -torch.rand(48, 3, generator=g) * 0.05, bits=4)
    layer = cls(blocks, torch.randn(48, generator=g))
    if cls is BlockLinear:  # its dense copy serves only an entry loaded where the block kernel is missing
        layer.dense_min_rows = 1
    assert layer.packed_dense is not None and "packed_dense" not in layer.state_dict()
    x = torch.randn(5, 96, generator=g)
    want = (x.to(torch.bfloat16) @ layer.dense.T).float() + layer.bias
    assert torch.equal(layer(x), want)
    compiled = torch.compile(layer, backend="aot_eager", fullgraph=True)  # no graph break at the packed op
    assert torch.equal(compiled(x), want)


def test_the_eager_path_does_not_import_the_compiler():
    """Only a traced call takes the custom op: its first eager call imported dynamo and triton (~1.3 s of a
    one-shot `radixlang generate`, and triton's leak report at exit)."""
    code = """
import sys, torch
from radixlang.kernels.cpu import prepacked
weight = torch.randn(64, 64).to(torch.bfloat16)
out = prepacked.dense_matmul(torch.randn(24, 64), weight, prepacked.pack(weight))
assert out.shape == (24, 64)
print("torch._dynamo" in sys.modules)
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "False"
