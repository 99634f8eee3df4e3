"""Tiny GPTQ / AWQ folders packed here from a transformers model's weights, word by word as each format's
spec describes, and each format's reference dequantisation (AutoGPTQ's and AutoAWQ's formulas) — the
oracles the loader is checked against; none of it uses radixlang's own packing code."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file, save_file

AWQ_PACK_ORDER = [0, 2, 4, 6, 1, 3, 5, 7]  # nibble i of a word holds output column AWQ_PACK_ORDER[i]
AWQ_REVERSE_ORDER = [0, 4, 1, 5, 2, 6, 3, 7]
LINEARS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def rtn_groups(w: torch.Tensor, bits: int, group_size: int, g_idx: torch.Tensor):
    """(codes [N, K], zeros [N, G], fp16 scales [N, G]) rounding each group to its [min, max]."""
    maxq = 2**bits - 1
    groups = int(g_idx.max()) + 1
    scales, zeros = torch.empty(w.shape[0], groups), torch.empty(w.shape[0], groups)
    for g in range(groups):
        cols = w[:, g_idx == g]
        lo, hi = cols.min(1).values.clamp(max=0), cols.max(1).values.clamp(min=0)
        scales[:, g] = ((hi - lo) / maxq).half().float()
        zeros[:, g] = torch.round(-lo / scales[:, g]).clamp(1, maxq)
    codes = torch.round(w / scales[:, g_idx]) + zeros[:, g_idx]
    return codes.clamp(0, maxq).int(), zeros.int(), scales.half()


def pack_words(values: np.ndarray, bits: int, order: list[int] | None = None) -> np.ndarray:
    """Packs the last axis 32 / bits values per uint32 word, slot i (bits i*b ...) holding value order[i]."""
    per = 32 // bits
    v = values.astype(np.uint32).reshape(*values.shape[:-1], -1, per)
    words = np.zeros(v.shape[:-1], dtype=np.uint32)
    for slot in range(per):
        words |= v[..., order[slot] if order else slot] << np.uint32(bits * slot)
    return words.view(np.int32)


def gptq_tensors(w: torch.Tensor, bits: int, group_size: int, act_order: bool, seed: int) -> dict:
    k = w.shape[1]
    gs = group_size if group_size > 0 else k
    g_idx = torch.arange(k) // gs
    if act_order:  # columns quantized in a random order: the j-th of them falls in group j // gs
        perm = torch.randperm(k, generator=torch.Generator().manual_seed(seed))
        g_idx = torch.empty(k, dtype=torch.long)
        g_idx[perm] = torch.arange(k) // gs
    codes, zeros, scales = rtn_groups(w, bits, gs, g_idx)
    qweight = pack_words(codes.numpy(), bits).T  # words of consecutive input columns: [K / per, N]
    qzeros = pack_words(np.ascontiguousarray(zeros.numpy().T - 1), bits)  # [G, N / per]; v1 stores zero - 1
    return {"qweight": torch.from_numpy(np.ascontiguousarray(qweight)), "qzeros": torch.from_numpy(qzeros),
            "scales": scales.T.contiguous(), "g_idx": g_idx.int()}


def awq_tensors(w: torch.Tensor, group_size: int) -> dict:
    k = w.shape[1]
    g_idx = torch.arange(k) // group_size
    codes, zeros, scales = rtn_groups(w, 4, group_size, g_idx)
    qweight = pack_words(np.ascontiguousarray(codes.numpy().T), 4, AWQ_PACK_ORDER)  # [K, N / 8]
    qzeros = pack_words(np.ascontiguousarray(zeros.numpy().T), 4, AWQ_PACK_ORDER)  # [G, N / 8]
    return {"qweight": torch.from_numpy(qweight), "qzeros": torch.from_numpy(qzeros), "scales": scales.T.contiguous()}


def gptq_reference_dequant(t: dict, bits: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """AutoGPTQ's formula (v1: zeros + 1), computed in fp16 as it does (or in `dtype`); returns [N, K]."""
    wf = torch.arange(0, 32, bits, dtype=torch.int32)
    mask = 2**bits - 1
    zeros = torch.bitwise_right_shift(t["qzeros"].unsqueeze(2), wf.view(1, 1, -1)) & mask
    zeros = (zeros + 1).reshape(zeros.shape[0], -1)
    weight = torch.bitwise_right_shift(t["qweight"].unsqueeze(1), wf.view(1, -1, 1)) & mask
    weight = weight.reshape(-1, weight.shape[-1])
    g = t["g_idx"].long()
    return (t["scales"][g].to(dtype) * (weight - zeros[g]).to(dtype)).T


def awq_reference_dequant(t: dict, group_size: int, dtype: torch.dtype = torch.float16) -> torch.Tensor:
    """AutoAWQ's dequantize_gemm: unpack, undo the interleave, (w - z) * s per group in fp16; [N, K]."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)

    def unpack(q):
        v = torch.bitwise_right_shift(q[:, :, None], shifts[None, None, :]).reshape(q.shape[0], -1)
        v = v.view(-1, 8)[:, AWQ_REVERSE_ORDER].view(q.shape[0], -1)
        return v & 15

    iweight, izeros = unpack(t["qweight"]), unpack(t["qzeros"])
    izeros = izeros.repeat_interleave(group_size, dim=0)
    scales = t["scales"].repeat_interleave(group_size, dim=0)
    return ((iweight - izeros).to(dtype) * scales.to(dtype)).T


def write_quantized_folder(src: Path, dst: Path, method: str, bits: int, group_size: int,
                           act_order: bool = False, dtype: torch.dtype = torch.float16) -> dict[str, torch.Tensor]:
    """Copies the HF folder `src` with every decoder linear packed; returns the reference weights,
    dequantised in `dtype` (fp16: as the reference kernels compute; fp32: the exact products)."""
    dst.mkdir(parents=True, exist_ok=True)
    state = load_file(str(src / "model.safetensors"))
    out, reference = {}, {}
    for name, tensor in state.items():
        prefix, _, kind = name.rpartition(".")
        if kind != "weight" or prefix.rpartition(".")[2] not in LINEARS:
            out[name] = tensor
            continue
        if method == "gptq":
            packed = gptq_tensors(tensor, bits, group_size, act_order, seed=len(out))
            reference[name] = gptq_reference_dequant(packed, bits, dtype)
        else:
            packed = awq_tensors(tensor, group_size)
            reference[name] = awq_reference_dequant(packed, group_size, dtype)
        out |= {f"{prefix}.{k}": v for k, v in packed.items()}
    save_file(out, str(dst / "model.safetensors"))
    config = json.loads((src / "config.json").read_text())
    qc = {"quant_method": method, "bits": bits, "group_size": group_size}
    qc |= {"desc_act": act_order, "sym": False} if method == "gptq" else {"version": "gemm", "zero_point": True}
    (dst / "config.json").write_text(json.dumps(config | {"quantization_config": qc}))
    for f in ("tokenizer.json", "tokenizer_config.json"):
        (dst / f).write_bytes((src / f).read_bytes())
    return reference
