"""The dense copy's matmul on CPU, with its weight packed once into oneDNN's blocked layout.

A plain `x @ w.T` makes oneDNN reorder `w` into its blocked layout on every call (for a 576 x 3072 bf16 layer,
3.5 MB read, written and read again), so a batched decode step, which reads each weight from memory, moved
about three times the weights' bytes. oneDNN's linear (`torch.ops.mkldnn._linear_pointwise`, the op inductor
emits for frozen graphs) takes the weight already packed: the packing is done here once, at load, and is
bit-equal to the plain matmul (the same kernel, only the reorder is gone). Measured on the AMX Xeon VM, bf16,
576 x 3072: 16 rows 122 -> 72 us, 256 rows 472 -> 331 us; a 16-row decode step of the default model (eager)
375 -> 450 tok/s.

The packed weight is an mkldnn-layout tensor, which inductor lowers only as a frozen constant; a custom op
(`radixlang::prepacked_linear`) keeps it opaque, so the compiled decode graph calls it as an extern kernel.
"""
from __future__ import annotations

import torch

# bf16 only: there the packed call is bit-equal to the plain matmul. An fp32 copy (AVX2 CPUs) stays plain: oneDNN's
# fp32 kernel differs from MKL's in the last bits, and its speed was not measured on such a CPU.
PACKABLE_DTYPES = (torch.bfloat16,)


@torch.library.custom_op("radixlang::prepacked_linear", mutates_args=())
def prepacked_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """x @ W.T for W packed by `pack` (x: [rows, in_features] in W's dtype)."""
    return _onednn_linear(x, packed)


def _onednn_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")  # no bias, no fused activation


@prepacked_linear.register_fake
def _prepacked_linear_shape(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty((x.shape[0], out_features))


def pack(dense: torch.Tensor) -> torch.Tensor | None:
    """`dense` ([out_features, in_features]) in oneDNN's blocked layout, or None where it stays plain (not on the
    CPU, torch without mkldnn, not bf16, no bf16 units). The layout is chosen for any row count (no batch
    hint): packed for 16 rows it was 10-15% slower at 64-512 rows and equal at 16."""
    if (dense.device.type != "cpu" or dense.dtype not in PACKABLE_DTYPES or not torch.backends.mkldnn.is_available()
            or not bf16_units()):
        return None
    return torch.ops.mkldnn._reorder_linear_weight(dense.contiguous(), None)


def bf16_units() -> bool:
    """Whether oneDNN runs bf16 natively here (AVX512_BF16 or AMX, at torch's AVX512 dispatch level, the only one
    where torch's AVX512 kernels and oneDNN's bf16 paths run): the CPUs this was measured on, and where cpu_paths
    makes the dense copies bf16. Elsewhere (an AVX2 CPU with bf16 copies forced
    by RADIXLANG_CPU_PATHS=bf16) the plain matmul stays."""
    return torch.backends.cpu.get_cpu_capability().startswith("AVX512") and (
        torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported())


def dense_matmul(flat: torch.Tensor, dense: torch.Tensor, packed: torch.Tensor | None) -> torch.Tensor:
    """flat @ dense.T in dense's dtype, on the packed copy where there is one."""
    flat = flat.to(dense.dtype)
    if packed is None:
        return flat @ dense.T
    if torch.compiler.is_compiling():  # traced: the opaque op, which inductor calls as an extern kernel
        return prepacked_linear(flat.contiguous(), packed, dense.shape[0])
    # eager: oneDNN's op itself. The custom op's first call imports dynamo (and triton), ~1.3 s of a one-shot
    # `radixlang generate`, which then also printed triton's nanobind leak report at exit
    return _onednn_linear(flat.contiguous(), packed)
