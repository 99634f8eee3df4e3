"""Quantized HF folders: `quantization_config` checked, the packed tensors read, and the model's linears
swapped for native kernels once the (dequantized, fp32) weights have loaded.

Weight-only GPTQ / AWQ run on torch's CPU int4pack kernel (quant.Int4Linear): a group of 32..128 columns
with scale s and zero z is W = (code - 8) * s + s * (8 - z) per run of 32, exactly the kernel's affine
form; 8-bit codes go through its hi/lo split. Act-order (desc_act) checkpoints list each column's group
in g_idx: the columns are sorted by group once at load and the input is gathered in that order per call
(the kernel needs contiguous groups). Fused q/k/v or gate/up whose parts were sorted differently run as
separate kernels. W8A8 int8 folders run on w8a8.W8A8Linear, and so does their tied LM head (quantize_tied_head);
radixlang's SmoothQuant folders (down_proj_rotation: "hadamard") rotate down_proj's input first (hadamard.py).

On a CUDA GPU GPTQ / AWQ run on the Triton dequant-GEMM (triton_quant.TritonIntLinear), from the same
group-sorted codes and input order, and W8A8 folders on the Triton int8 GEMM (triton_quant.TritonW8A8Linear);
other devices keep the dequantized weights.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterator, Literal, TypeVar

import torch
from torch import nn

from ....kernels.cpu.gguf_blocks import GROUP, GroupQuant
from ....kernels.registry import ATTENTION_BACKENDS
from ..llama import packed_parts, packed_target
from .hadamard import HadamardInput
from .quant import Int4Linear, packable
from .quant_formats import IntWeight, read_awq, read_gptq
from .triton_quant import TritonIntLinear, TritonW8A8Linear
from .w8a8 import W8A8Linear

T = TypeVar("T")
METHODS = ("gptq", "awq", "w8a8_int8")
Kernels = Literal["cpu", "triton"]  # torch's CPU int4pack / int8 kernels, or the Triton dequant-GEMM (GPU)
GROUP_SIZES = (-1, 32, 64, 128)
_PACKED_SUFFIXES = {"gptq": ("qweight", "qzeros", "scales", "g_idx"), "awq": ("qweight", "qzeros", "scales"),
                    "w8a8_int8": ("weight", "weight_scale")}


@dataclass(frozen=True, slots=True)
class CheckpointQuant:
    method: str
    bits: int = 8
    group_size: int = -1
    desc_act: bool = False
    zero_offset: int = 0  # GPTQ v1 stores zeros minus one
    # W8A8 (radixlang's SmoothQuant): down_proj's weights are W H^T and its input is rotated by H at run time
    # (hadamard.HadamardInput); other loaders of w8a8_int8 (SGLang) do not know the field
    rotate_down: bool = False


def parse_quant_config(hf: dict[str, Any]) -> CheckpointQuant | None:
    """config.json's quantization_config, checked; None for an unquantized folder."""
    qc = hf.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise ValueError(f"quantization_config must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method not in METHODS:
        raise ValueError(f"quantization_config.quant_method {method!r} is not supported (one of {METHODS})")
    if method == "w8a8_int8":
        rotation = qc.get("down_proj_rotation")
        if rotation not in (None, "hadamard"):
            raise ValueError(f"quantization_config.down_proj_rotation must be null or 'hadamard', got {rotation!r}")
        return CheckpointQuant(method, rotate_down=rotation == "hadamard")
    bits = _choice(qc, "bits", (4, 8) if method == "gptq" else (4,))
    group_size = _choice(qc, "group_size", GROUP_SIZES)
    if method == "awq":
        _choice(qc, "version", ("gemm", "GEMM"), default="gemm")
        _choice(qc, "zero_point", (True, False), default=True)
        return CheckpointQuant(method, bits, group_size)
    desc_act = _choice(qc, "desc_act", (True, False), default=False)
    _choice(qc, "sym", (True, False), default=True)  # the zeros are stored either way
    fmt = _choice(qc, "checkpoint_format", ("gptq", "gptq_v2"), default="gptq")
    if qc.get("lm_head", False):
        raise ValueError("quantization_config.lm_head=true (a quantized LM head) is not supported")
    return CheckpointQuant(method, bits, group_size, desc_act, zero_offset=1 if fmt == "gptq" else 0)


def _choice(qc: dict[str, Any], key: str, allowed: tuple[T, ...], default: T | None = None) -> T:
    value = qc.get(key, default)
    if value is None or value not in allowed or isinstance(value, bool) != isinstance(allowed[0], bool):
        raise ValueError(f"quantization_config.{key} must be one of {list(allowed)}, got {value!r}")
    return value


QuantStore = dict[str, "IntWeight | tuple[torch.Tensor, torch.Tensor]"]  # HF weight name -> packed form


def dequantized_weights(weights: Iterator[tuple[str, torch.Tensor]], qc: CheckpointQuant,
                        store: QuantStore | None) -> Iterator[tuple[str, torch.Tensor]]:
    """The checkpoint's tensors with every quantized linear as one fp32 `<prefix>.weight`; `store` (if
    given) receives each one's packed form under that name."""
    suffixes = _PACKED_SUFFIXES[qc.method]
    parts: dict[str, dict[str, torch.Tensor]] = {}
    for name, tensor in weights:
        prefix, _, suffix = name.rpartition(".")
        if suffix in suffixes and (qc.method != "w8a8_int8" or tensor.dtype == torch.int8 or suffix != "weight"):
            parts.setdefault(prefix, {})[suffix] = tensor
        else:
            yield name, tensor
    for prefix, tensors in parts.items():
        packed = _read_packed(prefix, tensors, qc)
        if store is not None:
            store[f"{prefix}.weight"] = packed
        yield f"{prefix}.weight", packed.dequantize() if isinstance(packed, IntWeight) else packed[0] * packed[1]


def _read_packed(prefix: str, t: dict[str, torch.Tensor], qc: CheckpointQuant):
    required = _PACKED_SUFFIXES[qc.method][:3] if qc.method != "w8a8_int8" else ("weight", "weight_scale")
    missing = [s for s in required if s not in t]
    if missing:
        raise ValueError(f"quantized linear {prefix!r} is missing {missing}")
    if qc.method == "w8a8_int8":
        return t["weight"].float(), t["weight_scale"].float().reshape(-1, 1)
    if qc.method == "awq":
        return read_awq(t["qweight"], t["qzeros"], t["scales"], qc.group_size)
    g_idx = t.get("g_idx") if qc.desc_act else None
    return read_gptq(t["qweight"], t["qzeros"], t["scales"], g_idx, qc.bits, qc.group_size, qc.zero_offset)


# ---- native kernels ----------------------------------------------------------------------------------


class PermutedInput(nn.Module):
    """A linear whose input columns are taken in `order` first (act-order weights, sorted by group)."""

    order: torch.Tensor  # a buffer, registered in __init__

    def __init__(self, order: torch.Tensor, inner: nn.Module):
        super().__init__()
        self.register_buffer("order", order)
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.index_select(-1, self.order))


class ConcatOutputs(nn.Module):
    """Several linears on one input, outputs side by side (fused q/k/v whose parts need separate kernels)."""

    def __init__(self, parts: list[nn.Module]):
        super().__init__()
        self.parts = nn.ModuleList(parts)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([p(x) for p in self.parts], dim=-1)


def group_quant(w: IntWeight) -> GroupQuant:
    """Group-sorted IntWeight as GroupQuant's runs of 32 columns (W = scale * code + minimum)."""
    run_groups = w.g_idx[::GROUP]
    scale = w.scales.float()[:, run_groups]
    zero = w.zeros[:, run_groups].float()
    if w.bits == 4:
        return GroupQuant(w.codes.to(torch.int16), scale, -zero * scale, bits=4)
    return GroupQuant((w.codes - 128).to(torch.int16), scale, (128 - zero) * scale, bits=8)  # Q8_0's signed codes


def runs_share_groups(w: IntWeight) -> bool:
    """Whether every run of 32 input columns lies in one group (the kernel's granularity)."""
    k = w.codes.shape[1]
    return k % GROUP == 0 and bool((w.g_idx.view(-1, GROUP) == w.g_idx[::GROUP, None]).all())


def checkpoint_kernels(device: torch.device) -> Kernels | None:
    """The native kernels for a quantized checkpoint on `device` (None: keep the dequantized weights)."""
    if device.type == "cpu":
        return "cpu"
    return "triton" if device.type == "cuda" and "triton" in ATTENTION_BACKENDS else None


def pack_checkpoint_linears(model: nn.Module, store: QuantStore, kernels: Kernels = "cpu") -> int:
    """Swaps each linear whose weights `store` holds for its native kernel; returns how many."""
    targets: dict[str, dict[str | None, Any]] = {}
    for name, packed in store.items():
        target, part = packed_target(name.removeprefix("model."))
        targets.setdefault(target.removesuffix(".weight"), {})[part] = packed
    replaced = 0
    for module_name, parts in targets.items():
        linear = model.get_submodule(module_name)
        assert isinstance(linear, nn.Linear), f"{module_name} is a {type(linear).__name__}, not a linear"
        ordered = [parts[None]] if None in parts else [parts[p] for p in packed_parts(f"{module_name}.weight")]
        native = _native(ordered, linear.bias, kernels, linear.weight.device)
        if native is not None:
            parent, _, attr = module_name.rpartition(".")
            setattr(model.get_submodule(parent), attr, native)
            replaced += 1
    if kernels == "cpu" and any(isinstance(packed, tuple) for packed in store.values()):
        replaced += quantize_tied_head(model)
    return replaced


def rotate_down_inputs(model: nn.Module) -> int:
    """Every decoder layer's down_proj (weights W H^T, as `radixlang quantize` wrote them) runs on H x
    (CheckpointQuant.rotate_down); returns how many."""
    layers, embedding = getattr(model, "layers", None), getattr(model, "embed_tokens", None)
    cfg: Any = getattr(model, "config", None)
    if layers is None or embedding is None or cfg is None:
        raise ValueError("quantization_config.down_proj_rotation is for dense decoder models")
    for layer in layers:  # the rotation runs in the activations' dtype, the model's
        layer.mlp.down_proj = HadamardInput(cfg.intermediate_size, layer.mlp.down_proj,
                                            embedding.weight.dtype, embedding.weight.device)
    return len(layers)


def quantize_tied_head(model: nn.Module) -> int:
    """A W8A8 folder's tied LM head becomes a W8A8 linear over an int8 copy of the embedding (which stays
    fp32 for lookups); returns 1 if it did. On SmolLM2 (benchmark/quantization.py's texts, 2026-12-02) the
    fp32 head cost SmoothQuant W8A8 13% of batch-1 decode, 32% of 16x64 decode and 20% of prefill, and the
    int8 one moved perplexity by -0.034 (fixed text) / +0.024 (long text)."""
    embed = getattr(model, "embed_tokens", None)
    if embed is None or getattr(model, "lm_head", False) is not None:
        return 0
    model.lm_head = W8A8Linear.from_float(embed.weight, None)
    return 1


def _native(parts: list[Any], bias: torch.Tensor | None, kernels: Kernels, device: torch.device) -> nn.Module | None:
    if isinstance(parts[0], tuple):  # W8A8: int8 rows stack
        codes, scales = torch.cat([p[0] for p in parts]).to(torch.int8), torch.cat([p[1] for p in parts])
        return W8A8Linear(codes, scales, bias) if kernels == "cpu" else TritonW8A8Linear(codes, scales, bias).to(device)
    sorted_parts = [p.sorted_by_group() for p in parts]
    if not all(runs_share_groups(w) and (kernels == "triton" or packable(w.codes.shape[0], w.codes.shape[1], "int4"))
               for w, _ in sorted_parts):
        return None

    def linear(w: IntWeight, b: torch.Tensor | None) -> nn.Module:
        return TritonIntLinear(w, b, device) if kernels == "triton" else Int4Linear(group_quant(w), b)

    orders = [order for _, order in sorted_parts]
    if all(torch.equal(o, orders[0]) for o in orders):
        return _with_order(orders[0], linear(_cat_int_weights([w for w, _ in sorted_parts]), bias), device)
    biases = bias.split([w.codes.shape[0] for w, _ in sorted_parts]) if bias is not None else [None] * len(parts)
    return ConcatOutputs([_with_order(o, linear(w, b), device) for (w, o), b in zip(sorted_parts, biases)])


def _with_order(order: torch.Tensor, linear: nn.Module, device: torch.device) -> nn.Module:
    return linear if torch.equal(order, torch.arange(len(order))) else PermutedInput(order.to(device), linear)


def _cat_int_weights(parts: list[IntWeight]) -> IntWeight:
    if len(parts) == 1:
        return parts[0]
    return IntWeight(torch.cat([p.codes for p in parts]), torch.cat([p.zeros for p in parts]),
                     torch.cat([p.scales for p in parts]), parts[0].g_idx, parts[0].bits)
