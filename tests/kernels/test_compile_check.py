"""The Triton kernels compile for an H200 (sm_90) on this GPU-less machine, every variant the engine launches (over
plain and int8 / e4m3 KV caches), without register spills, within its shared memory, and bf16 on tensor cores; and
the check catches what the interpreter lets pass.

The compiles run in subprocesses: this process runs Triton under TRITON_INTERPRET=1 (tests/conftest.py),
which compiles nothing."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from radixlang.kernels.registry import ATTENTION_BACKENDS

pytestmark = pytest.mark.skipif("triton" not in ATTENTION_BACKENDS, reason="triton is not installed")

ROOT = Path(__file__).resolve().parents[2]
COMPILING = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}


def compiling(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, *args], cwd=ROOT, env=COMPILING, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def test_every_variant_the_backend_launches_compiles_for_sm90_without_spills():
    # one process per dtype, so the two CPUs of CI compile at once
    runs = {dtype: compiling(["-m", "radixlang.kernels.compile_check", "--dtypes", dtype, "--arch", "90"])
            for dtype in ("bfloat16", "float32")}
    for dtype, run in runs.items():
        out, err = run.communicate(timeout=600)
        assert run.returncode == 0, f"{dtype}: {err[-3000:]}"
        *lines, summary = [json.loads(line) for line in out.splitlines()]
        assert summary["problems"] == 0 and summary["variants"] == len(lines)
        for heads in ("9/3/64", "32/8/128"):
            mine = [v for v in lines if v["heads"] == heads and v["dtype"] == dtype]

            def seen(kernel: str, key: str) -> set:
                return {v["constants"][key] for v in mine if v["kernel"] == kernel}

            assert seen("_decode_kernel", "NUM_SPLITS") == {1, 2, 4, 8, 16}
            assert seen("_extend_kernel", "BLOCK_R") == {16, 32, 64, 128}
            assert seen("_extend_kernel", "WRITE_LSE") == {False, True}  # plain extends; cascade prefixes
            assert seen("_merge_splits_kernel", "BLOCK_S") == {1, 2, 4, 8, 16, 32}  # up to a cascade's most parts
            assert all(v["constants"]["UPCAST"] is False for v in mine if "UPCAST" in v["constants"])
            assert all(0 < v["registers"] <= 255 and v["local_bytes"] == 0 for v in mine)
            attention = [v for v in mine if v["kernel"] != "_merge_splits_kernel"]
            assert all(v["dots"] == 2 for v in attention)  # q.k and p.v
            # bf16 multiplies on tensor cores (on Hopper, wgmma once a block has 64 rows); fp32 stays exact
            assert all((v["tensor_core_ops"] > 0) == (dtype == "bfloat16") for v in attention)
            assert dtype != "bfloat16" or any(v["constants"].get("BLOCK_R", 0) >= 64 for v in attention)
        sparse = [v for v in lines if v["heads"].startswith("mla")]  # MLA latent decode, fused-MoE GEMMs
        assert sorted(v["kernel"] for v in sparse) == ["_grouped_gemm_kernel"] * 2 + ["_mla_decode_kernel"]
        assert all(0 < v["registers"] <= 255 and v["local_bytes"] == 0 for v in sparse)
        dequant = [v for v in lines if v["heads"] == "dequant gemm"]  # GPTQ / AWQ: bits x row-block sizes
        bits_rows = sorted((v["constants"]["BITS"], v["constants"]["BLOCK_M"]) for v in dequant)
        assert bits_rows == [(4, 16), (4, 64), (8, 16), (8, 64)]
        assert all(0 < v["registers"] <= 255 and v["local_bytes"] == 0 and v["dots"] == 1 for v in dequant)
        assert all((v["tensor_core_ops"] > 0) == (dtype == "bfloat16") for v in dequant)
        w8a8 = [v for v in lines if v["heads"] == "w8a8 gemm"]  # the row quantiser; int8 GEMMs by row block
        quantiser = [v for v in w8a8 if v["kernel"] == "_quantize_rows_kernel"]
        assert [v["constants"]["BLOCK"] for v in quantiser] == [1024] and quantiser[0]["dots"] == 0
        # its divisions IEEE-rounded, as the CPU's (the interpreter's numpy `/` is too, so only here it shows)
        assert quantiser[0]["approx_divisions"] == 0
        gemms = [v for v in w8a8 if v["kernel"] == "_w8a8_gemm_kernel"]
        assert sorted((v["constants"]["BLOCK_M"], v["constants"]["SCALED"], v["constants"]["HAS_BIAS"]) for v in gemms) \
            == [(16, True, False), (16, True, True), (64, False, False), (64, True, False), (64, True, True)]
        assert all(0 < v["registers"] <= 255 and v["local_bytes"] == 0 for v in w8a8)
        assert all(v["dots"] == 1 and v["tensor_core_ops"] > 0 for v in gemms)  # int8 on tensor cores, any out dtype
        for codes in ("int8", "fp8_e4m3"):  # attention over a quantized KV cache: codes dequantized as they load
            quant = [v for v in lines if v["heads"] == f"9/3/64 kv {codes}" and v["kernel"] != "_merge_splits_kernel"]
            assert {v["kernel"] for v in quant} == {"_decode_kernel", "_extend_kernel"}
            assert all(v["constants"]["QUANT"] is True and v["dots"] == 2 for v in quant)
            assert {v["constants"]["NUM_SPLITS"] for v in quant if v["kernel"] == "_decode_kernel"} == {1, 16}
            assert all(0 < v["registers"] <= 255 and v["local_bytes"] == 0 for v in quant)
            assert all((v["tensor_core_ops"] > 0) == (dtype == "bfloat16") for v in quant)
        lora = [v for v in lines if v["heads"] == "lora delta"]  # the gathered LoRA delta: shrink, then expand
        assert sorted(v["constants"]["BLOCK_R"] for v in lora) == [32, 256]
        assert all(0 < v["registers"] <= 255 and v["local_bytes"] == 0 and v["dots"] == 2 for v in lora)
        assert all((v["tensor_core_ops"] > 0) == (dtype == "bfloat16") for v in lora)


KERNEL_WITH_A_PLAIN_GLOBAL = textwrap.dedent("""
    import torch, triton, triton.language as tl
    TWICE = 2.0  # not a tl.constexpr

    @triton.jit
    def double(X):
        tl.store(X, tl.load(X) * TWICE)

    x = torch.ones(1)
    {launch}
""")


def test_the_check_rejects_a_plain_global_which_the_interpreter_accepts(tmp_path):
    interpret, compile_ = tmp_path / "interpret.py", tmp_path / "compile.py"  # triton reads a kernel's source file
    interpret.write_text(KERNEL_WITH_A_PLAIN_GLOBAL.format(launch="double[(1,)](x); print(x.item())"))
    compile_.write_text(KERNEL_WITH_A_PLAIN_GLOBAL.format(
        launch="from radixlang.kernels.compile_check import compile_only\nwith compile_only(90):\n    double[(1,)](x)"))
    interpreted = subprocess.run([sys.executable, str(interpret)], cwd=ROOT, env={**COMPILING, "TRITON_INTERPRET": "1"},
                                 capture_output=True, text=True, timeout=300)
    assert interpreted.returncode == 0 and interpreted.stdout.split()[-1] == "2.0", interpreted.stderr[-2000:]
    run = compiling([str(compile_)])
    _, err = run.communicate(timeout=300)
    assert run.returncode != 0 and "Cannot access global variable TWICE" in err, err[-2000:]


def test_problems_name_spills_shared_memory_beyond_the_gpu_and_dots_off_tensor_cores():
    from radixlang.kernels.compile_check import SHARED_BYTES, Variant, problems

    def variant(local: int = 0, shared: int = 1024, mma: int = 8, dtype: str = "bfloat16") -> Variant:
        return Variant("_decode_kernel", dtype, "9/3/64", {"NUM_SPLITS": 4}, 4, shared, 128, local, 2, mma)

    limit = SHARED_BYTES[90]
    assert problems([variant(shared=limit), variant(mma=0, dtype="float32")], 90) == []
    spill, big, slow = problems([variant(local=16), variant(shared=limit + 1), variant(mma=0)], 90)
    assert "16 bytes of local memory" in spill and "NUM_SPLITS" in spill
    assert f"needs {limit + 1} bytes of shared memory; sm_90 has {limit}" in big
    assert "2 tl.dot ops run on CUDA cores" in slow
