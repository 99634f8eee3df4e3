"""The packed tensors of quantized HF checkpoints (GPTQ, AWQ, W8A8 int8) as plain integer codes, and back.

Every weight-only format here stores W[n, k] = scale[n, g] * (code[n, k] - zero[n, g]) with g = g_idx[k]
(the group of input column k); they differ only in how the ints are packed into int32 words:
- GPTQ: qweight [K * bits / 32, N], 32 / bits codes of consecutive input columns per word, lowest bits
  first; qzeros [G, N * bits / 32] packs output columns the same way; scales [G, N] fp16; g_idx [K] int32
  (act-order checkpoints list each column's group, otherwise k // group_size). The original ("v1")
  format stores every zero minus one, so it is read back as qzeros + 1; "gptq_v2" stores it as is.
- AWQ (GEMM): qweight [K, N / 8] and qzeros [G, N / 8] pack 8 output columns per word in the
  interleaved order 0, 2, 4, 6, 1, 3, 5, 7 (nibble i holds column AWQ_ORDER[i]); scales [G, N] fp16.
- W8A8 int8 (SGLang's "w8a8_int8"): weight int8 [N, K] and weight_scale [N, 1]: W = scale * weight.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

AWQ_ORDER = (0, 2, 4, 6, 1, 3, 5, 7)


@dataclass(slots=True)
class IntWeight:
    """W[n, k] = scales[n, g_idx[k]] * (codes[n, k] - zeros[n, g_idx[k]]), codes in [0, 2**bits)."""

    codes: torch.Tensor  # int32 [N, K]
    zeros: torch.Tensor  # int32 [N, G]
    scales: torch.Tensor  # fp16 / fp32 [N, G], as stored
    g_idx: torch.Tensor  # int64 [K]
    bits: int

    def dequantize(self) -> torch.Tensor:
        """fp32 weights. Each product of an fp16 scale and a code difference (|d| < 2**8) is exact in
        fp32, so rounding this to fp16 equals a dequantisation computed in fp16."""
        diff = (self.codes - self.zeros[:, self.g_idx]).float()
        return self.scales.float()[:, self.g_idx] * diff

    def sorted_by_group(self) -> tuple["IntWeight", torch.Tensor]:
        """The same weights with input columns ordered by group, and that order (x[:, order] is the
        input these weights take). Identity unless the checkpoint used act-order."""
        order = torch.sort(self.g_idx, stable=True).indices
        return IntWeight(self.codes[:, order], self.zeros, self.scales, self.g_idx[order], self.bits), order


def unpack_int32(packed: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Codes packed 32 / bits per int32 along `dim`, lowest bits first; `order[i]`: the position within
    its word's run of the code in bit slot i (None: slot i is position i)."""
    per_word = 32 // bits
    shifts = torch.arange(0, 32, bits, dtype=torch.int32)
    words = packed.to(torch.int32).movedim(dim, -1)
    codes = (words.unsqueeze(-1) >> shifts) & ((1 << bits) - 1)  # [..., words, slot]
    if order is not None:
        codes = codes[..., list(_inverse(order))]
    return codes.reshape(*words.shape[:-1], words.shape[-1] * per_word).movedim(-1, dim)


def pack_int32(codes: torch.Tensor, bits: int, dim: int, order: tuple[int, ...] | None = None) -> torch.Tensor:
    """Inverse of unpack_int32."""
    per_word = 32 // bits
    c = codes.to(torch.int64).movedim(dim, -1)
    c = c.reshape(*c.shape[:-1], c.shape[-1] // per_word, per_word)
    if order is not None:
        c = c[..., list(order)]
    shifts = torch.arange(0, 32, bits, dtype=torch.int64)
    words = (c << shifts).sum(-1)  # disjoint bit fields: the sum is their OR
    words = torch.where(words >= 2**31, words - 2**32, words)  # as the signed int32 the formats store
    return words.to(torch.int32).movedim(-1, dim).contiguous()


def _inverse(order: tuple[int, ...]) -> tuple[int, ...]:
    inv = [0] * len(order)
    for slot, position in enumerate(order):
        inv[position] = slot
    return tuple(inv)


def read_gptq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, g_idx: torch.Tensor | None,
              bits: int, group_size: int, zero_offset: int) -> IntWeight:
    """`zero_offset`: 1 for the v1 format (zeros stored minus one), 0 for gptq_v2."""
    codes = unpack_int32(qweight, bits, dim=0).T.contiguous()  # [N, K]
    in_features = codes.shape[1]
    zeros = (unpack_int32(qzeros, bits, dim=1) + zero_offset).T.contiguous()
    if g_idx is None:
        g_idx = torch.arange(in_features) // (group_size if group_size > 0 else in_features)
    return IntWeight(codes, zeros, scales.T.contiguous(), g_idx.long(), bits)


def write_gptq(w: IntWeight, zero_offset: int) -> dict[str, torch.Tensor]:
    """qweight / qzeros / scales / g_idx of a GPTQ checkpoint (the v1 format wraps a zero of 0 to
    2**bits - 1, as every v1 writer does: the quantizer keeps zeros >= 1 for it)."""
    zeros = (w.zeros - zero_offset) & ((1 << w.bits) - 1)
    return {"qweight": pack_int32(w.codes.T, w.bits, dim=0), "qzeros": pack_int32(zeros.T, w.bits, dim=1),
            "scales": w.scales.T.contiguous().half(), "g_idx": w.g_idx.to(torch.int32)}


def read_awq(qweight: torch.Tensor, qzeros: torch.Tensor, scales: torch.Tensor, group_size: int) -> IntWeight:
    codes = unpack_int32(qweight, 4, dim=1, order=AWQ_ORDER).T.contiguous()  # [N, K]
    zeros = unpack_int32(qzeros, 4, dim=1, order=AWQ_ORDER).T.contiguous()
    in_features = codes.shape[1]
    g_idx = torch.arange(in_features) // (group_size if group_size > 0 else in_features)
    return IntWeight(codes, zeros, scales.T.contiguous(), g_idx, 4)


def write_awq(w: IntWeight) -> dict[str, torch.Tensor]:
    return {"qweight": pack_int32(w.codes.T, 4, dim=1, order=AWQ_ORDER),
            "qzeros": pack_int32(w.zeros.T, 4, dim=1, order=AWQ_ORDER), "scales": w.scales.T.contiguous().half()}
