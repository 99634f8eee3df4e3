"""GGUF Q4_0 / Q4_1 / Q8_0 tensors as group-affine integer codes, read from the raw blocks (not dequantized).

Each block holds 32 consecutive weights of one row: an fp16 scale d, for Q4_1 an fp16 minimum m, and the
codes. The weights are `d * q + m` with q in [0, 15] (Q4_1), `d * (q - 8)` (Q4_0) or `d * q` with q in
[-128, 127] (Q8_0), so every type is `scale * code + minimum` per block, which packed kernels run as is.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

GROUP = 32  # weights per block in every type read here
_Q4_0, _Q4_1, _Q8_0 = 2, 3, 8  # ggml type ids (gguf.GGMLQuantizationType)
PACKABLE = (_Q4_0, _Q4_1, _Q8_0)


@dataclass(slots=True)
class GroupQuant:
    """W[n, k] = scale[n, k // GROUP] * codes[n, k] + minimum[n, k // GROUP]."""

    codes: torch.Tensor  # int16 [N, K]: [0, 15] for 4-bit types, [-128, 127] for Q8_0
    scale: torch.Tensor  # fp32 [N, K / GROUP]
    minimum: torch.Tensor  # fp32 [N, K / GROUP]
    bits: int

    def dequantize(self) -> torch.Tensor:
        rows, cols = self.codes.shape
        groups = self.codes.view(rows, cols // GROUP, GROUP).float()  # scales broadcast over their group
        return (self.scale[..., None] * groups + self.minimum[..., None]).view(rows, cols)

    def rows(self, index: torch.Tensor) -> "GroupQuant":
        return GroupQuant(self.codes[index], self.scale[index], self.minimum[index], self.bits)


def cat_rows(parts: list[GroupQuant]) -> GroupQuant:
    """Stacks the output rows of several tensors (q, k, v -> qkv), as the fp32 loader concatenates them."""
    bits = {p.bits for p in parts}
    assert len(bits) == 1, "fused parts share one type"
    return GroupQuant(torch.cat([p.codes for p in parts]), torch.cat([p.scale for p in parts]),
                      torch.cat([p.minimum for p in parts]), bits.pop())


def read_blocks(data: np.ndarray, tensor_type: int, shape: tuple[int, int]) -> GroupQuant:
    """`data`: the tensor's raw bytes; `shape`: (rows, cols) in torch order."""
    rows, cols = shape
    blocks = np.ascontiguousarray(data).reshape(rows, cols // GROUP, -1)
    d = _fp16(blocks, 0)
    if tensor_type == _Q8_0:
        codes = blocks[..., 2:].view(np.int8).astype(np.int16)
        return _group_quant(codes, d, np.zeros_like(d), bits=8)
    offset = 4 if tensor_type == _Q4_1 else 2
    packed = blocks[..., offset:]  # byte j holds weight j (low nibble) and weight j + 16 (high nibble)
    codes = np.concatenate([packed & 0xF, packed >> 4], axis=-1).astype(np.int16)
    minimum = _fp16(blocks, 2) if tensor_type == _Q4_1 else -8 * d
    return _group_quant(codes, d, minimum, bits=4)


def _fp16(blocks: np.ndarray, at: int) -> np.ndarray:
    return np.ascontiguousarray(blocks[..., at:at + 2]).view(np.float16)[..., 0].astype(np.float32)


def _group_quant(codes: np.ndarray, scale: np.ndarray, minimum: np.ndarray, bits: int) -> GroupQuant:
    rows = codes.shape[0]
    return GroupQuant(torch.from_numpy(codes.reshape(rows, -1).copy()), torch.from_numpy(scale.copy()),
                      torch.from_numpy(np.ascontiguousarray(minimum)), bits)
