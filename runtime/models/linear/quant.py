"""Weight-only low-bit linears for CPU decode: a GGUF's blocks (and "int4"'s groups) on radixlang's block kernel
(BlockLinear over block_kernel.py's `radixlang_cpu::block_mm`: int8 activations per 32, integer dot products,
llama.cpp's method; AVX-512 VNNI on weights interleaved by 16 features where built so, AVX2 on rows elsewhere),
and torch's packed CPU kernels (Int4Linear, Int8Linear) where that kernel is not
built (no AVX2 or g++, or while its one-time build runs in the background) and for "int8".

At batch 1 a decode step reads every weight once, so its time is the bytes read: int8 reads a quarter of
fp32's, int4 an eighth (plus one scale and zero per 32 weights). torch's int8pack / int4pack kernels are
fast only with bf16 activations (fp32 or fp16 inputs run 50-100x slower here), so inputs are cast to bf16
for the matmul and the result back to the model's dtype. Outputs then differ slightly from the fp32
model, the oracle (`quantization="none"`).

The packed kernels unpack every weight once per few input rows, so their cost grows with the rows: from
a layer's `dense_min_rows` rows on (batched decode steps, prefill chunks) it runs a dense matmul instead, on
a copy of its weights in DENSE_DTYPE: bf16 on CPUs with bf16 units, fp32 elsewhere (int8 codes are exact in
bf16, 4-bit weights d * q + m round to bf16), whose bf16 matmul runs on a weight packed once for oneDNN
(prepacked.py). cpu_paths.py chooses both: the dtype from the CPU's features,
the rows from a one-time measurement on this machine, per form (4-bit, or Q8_0's two halves).

Modes: "none" fp32 (exact); "auto" runs a GGUF's Q4_0 / Q4_1 / Q8_0 tensors from the file's own blocks
(other tensors and HF folders stay fp32); "int8" per-output-channel int8 of every linear; "int4"
group-wise (32) round-to-nearest int4 of every linear.
"""
from __future__ import annotations

import math

import torch
from torch import nn

from ....kernels.cpu import block_kernel, prepacked
from ....kernels.cpu.gguf_blocks import GROUP, GroupQuant, cat_rows
from ..llama import packed_parts, packed_target
from . import cpu_paths
from .cpu_paths import detect

K_MULTIPLE = 64  # torch 2.13's CPU int8pack kernel crashes on some other input widths (K=40 with M>=5)
N_MULTIPLE = 16  # the CPU int4pack layout tiles output rows by 16
INNER_K_TILES = 2  # the CPU int4pack conversion takes it but lays weights out the same for 2, 4 and 8
# rows from which a layer runs a dense matmul instead of the packed kernel (None: cpu_paths measures them
# on this machine, once; tests pin a number), and the dense copy's dtype (from the CPU's features)
DENSE_MIN_ROWS: int | None = None
DENSE_DTYPE = detect().dense_dtype


def dense_min_rows(halves: int = 1) -> int:
    """Rows from which a packed linear of `halves` int4 halves (Q8_0: 2) runs its dense copy."""
    return DENSE_MIN_ROWS if DENSE_MIN_ROWS is not None else cpu_paths.dense_min_rows(halves)


# a BlockLinear with the kernel loaded never runs its dense copy: one numeric path for every row count (below)
BLOCK_NEVER_DENSE = 1 << 62


class Int8Linear(nn.Module):
    """y = x W^T + b with W = qweight * scale[:, None] (symmetric, per output channel)."""

    qweight: torch.Tensor  # buffers (registered in __init__, so they move and save with the module)
    scale: torch.Tensor
    dense: torch.Tensor
    packed_dense: torch.Tensor | None  # dense, packed for oneDNN (not saved: redone at load)
    dense_min_rows: int  # rows from which forward runs the dense copy (not saved: chosen per machine)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None):
        super().__init__()
        self.dense_min_rows = dense_min_rows()
        w = weight.detach().float()
        scale = w.abs().amax(dim=1).clamp(min=torch.finfo(torch.float32).tiny) / 127.0
        self.register_buffer("qweight", torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8))
        self.register_buffer("scale", scale.to(torch.bfloat16))
        self.register_buffer("dense", self.qweight.to(DENSE_DTYPE))  # codes in [-127, 127]: exact in bf16
        _attach_packed_dense(self)
        self.bias = _bias(bias)

    def dequantized(self) -> torch.Tensor:
        """The weights this layer computes with, in fp32."""
        return self.qweight.float() * self.scale.float()[:, None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _flat(x)
        if flat.shape[0] >= self.dense_min_rows:  # the kernel's own order: sum of x * code, then the scale
            dense = prepacked.dense_matmul(flat, self.dense, self.packed_dense)
            return _finish(dense.float() * self.scale.float(), x, self.bias)
        out = torch.ops.aten._weight_int8pack_mm(flat.to(torch.bfloat16), self.qweight, self.scale)
        return _finish(out, x, self.bias)


class Int4Linear(nn.Module):
    """y = x W^T + b for a group-affine W (GroupQuant) on the int4pack kernel, which computes
    (code - 8) * scale + zero per group of 32. A 4-bit W maps onto it exactly: zero = minimum + 8 * scale.
    An 8-bit W (Q8_0) is split as code = 16 * hi + lo with both halves 4-bit, laid side by side along K,
    and the input is repeated twice: one kernel call, still exactly the file's weights."""

    packed: torch.Tensor  # buffers (registered in __init__, so they move and save with the module)
    scales_zeros: torch.Tensor
    dense: torch.Tensor
    packed_dense: torch.Tensor | None  # dense, packed for oneDNN (not saved: redone at load)
    dense_min_rows: int  # rows from which forward runs the dense copy (not saved: chosen per machine)

    def __init__(self, weights: GroupQuant, bias: torch.Tensor | None, keep_blocks: bool = False):
        super().__init__()
        codes, scale, zero = _int4_operands(weights)
        self.in_features = weights.codes.shape[1]
        self.repeats = codes.shape[1] // self.in_features
        self.dense_min_rows = dense_min_rows(self.repeats)
        self.register_buffer("packed", torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, INNER_K_TILES))
        self.register_buffer("scales_zeros", torch.stack([scale.T, zero.T], dim=-1).to(torch.bfloat16).contiguous())
        self.register_buffer("dense", weights.dequantize().to(DENSE_DTYPE))
        _attach_packed_dense(self)
        self.bits = weights.bits
        if keep_blocks:  # the block kernel is being built: the weight cache entry then serves BlockLinear later
            for name, tensor in zip(("qweight", "scale", "minimum"), block_kernel.block_operands(weights)):
                self.register_buffer(name, tensor)
        self.bias = _bias(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _flat(x)
        if flat.shape[0] >= self.dense_min_rows:
            return _finish(prepacked.dense_matmul(flat, self.dense, self.packed_dense), x, self.bias)
        flat = flat.to(torch.bfloat16)
        if self.repeats > 1:
            flat = flat.repeat(1, self.repeats)
        out = torch.ops.aten._weight_int4pack_mm_for_cpu(flat, self.packed, GROUP, self.scales_zeros)
        return _finish(out, x, self.bias)


class BlockLinear(nn.Module):
    """y = x W^T + b for a block-quantized W (GroupQuant: a GGUF's Q4_0 / Q4_1 / Q8_0 blocks, or "int4"'s
    round-to-nearest groups) on the native AVX2 kernel (block_kernel.py: `torch.ops.radixlang_cpu.block_mm`),
    from the blocks as stored. The kernel quantizes the activations per 32 to int8 (block_mm.cpp states the
    rule), so outputs differ from the fp32 model (the oracle) by that rounding: at most half a step of 1/127 of
    each block's largest input.

    It runs the kernel at every row count, never a dense copy: a row's result is then bitwise the same whether
    it is computed alone (a decode, an extend over a cached prefix), beside other requests' rows, or in a long
    prefill chunk (the kernel's integer block sums are exact and each row's float accumulation runs over the
    blocks in one order, whatever the rows around it). The radix cache, batching and chunking change nothing
    but speed (issue 43: with the dense copy from ~20 rows on, a cached prompt's answer changed). A dense bf16
    copy is faster from a few dozen rows (prefill) on CPUs with AMX; that speed is traded for the invariance.
    The dense copy stays as the path of an entry loaded where the kernel is missing (dense_min_rows 1)."""

    qweight: torch.Tensor  # buffers (registered in __init__, so they move and save with the module)
    scale: torch.Tensor
    minimum: torch.Tensor
    dense: torch.Tensor
    packed_dense: torch.Tensor | None  # dense, packed for oneDNN (not saved: redone at load)
    dense_min_rows: int  # rows from which forward runs the dense copy (not saved: chosen per machine)

    def __init__(self, weights: GroupQuant, bias: torch.Tensor | None, interleaved: bool | None = None):
        super().__init__()
        qweight, scale, minimum = block_kernel.block_operands(weights, interleaved)
        self.in_features, self.bits = weights.codes.shape[1], weights.bits
        self.dense_min_rows = BLOCK_NEVER_DENSE
        self.register_buffer("qweight", qweight)
        self.register_buffer("scale", scale)
        self.register_buffer("minimum", minimum)
        self.register_buffer("dense", weights.dequantize().to(DENSE_DTYPE))
        _attach_packed_dense(self)
        self.bias = _bias(bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = _flat(x)
        if flat.shape[0] >= self.dense_min_rows:
            return _finish(prepacked.dense_matmul(flat, self.dense, self.packed_dense), x, self.bias)
        out = torch.ops.radixlang_cpu.block_mm(flat.float(), self.qweight, self.scale, self.minimum, self.bits)
        return _finish(out, x, self.bias)


def _int4_operands(w: GroupQuant) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(codes in [0, 15], scale, zero) with W = (codes - 8) * scale + zero per group."""
    if w.bits == 4:
        return w.codes.int(), w.scale, w.minimum + 8 * w.scale
    hi = torch.div(w.codes, 16, rounding_mode="floor")  # [-8, 7]
    lo = w.codes - 16 * hi  # [0, 15]
    codes = torch.cat([hi + 8, lo], dim=1).int()
    return codes, torch.cat([16 * w.scale, w.scale], dim=1), torch.cat([w.minimum, 8 * w.scale], dim=1)


def _bias(bias: torch.Tensor | None) -> nn.Parameter | None:
    return None if bias is None else nn.Parameter(bias.detach().clone(), requires_grad=False)


def _attach_packed_dense(module: Int8Linear | Int4Linear | BlockLinear) -> None:
    """The dense copy packed for oneDNN (prepacked.py), as a buffer that is not saved: the weight cache keeps the
    plain copy, and the packing (~1 ms a MB; 0.28 s for the default model) is redone at each load."""
    module.register_buffer("packed_dense", prepacked.pack(module.dense), persistent=False)


def _flat(x: torch.Tensor) -> torch.Tensor:
    """x as [rows, in_features] (the model's activations are already 2-D); the packed kernels take it in bf16."""
    return x if x.dim() == 2 else x.reshape(-1, x.shape[-1])


def _finish(out: torch.Tensor, x: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    out = out.to(x.dtype)
    if x.dim() != 2:
        out = out.view(*x.shape[:-1], out.shape[-1])
    return out if bias is None else out + bias


def quantize_int4_rtn(weight: torch.Tensor) -> GroupQuant:
    """Round-to-nearest asymmetric int4 per group of 32 input columns: codes in [0, 15] span each
    group's [min, max], so the error is at most half a step, (max - min) / 30."""
    w = weight.detach().float()
    groups = w.view(w.shape[0], -1, GROUP)
    # minimum and scale in fp16 (where in its range), as a GGUF stores them, for the block kernel's interleaved
    # layout; rounded outward (minimum down, scale up), so the codes still span the group and the bound holds
    low, high = _half_toward(groups.amin(dim=-1), -math.inf), groups.amax(dim=-1)
    scale = _half_toward(((high - low) / 15).clamp(min=2**-24), math.inf)  # 2^-24: fp16's least step, never 0
    codes = torch.round((groups - low[..., None]) / scale[..., None]).clamp(0, 15)
    return GroupQuant(codes.view_as(w).to(torch.int16), scale, low, bits=4)


def _half_toward(values: torch.Tensor, direction: float) -> torch.Tensor:
    """`values` rounded to fp16 toward `direction` (-inf: the largest fp16 at most each value; inf: the least at
    least), as fp32; a value beyond fp16's range stays as it is."""
    half = values.half()
    wrong_side = half.float() > values if direction < 0 else half.float() < values
    half = torch.where(wrong_side, torch.nextafter(half, torch.full_like(half, direction)), half)
    return torch.where(torch.isfinite(half), half.float(), values)


def packable(out_features: int, in_features: int, mode: str) -> bool:
    """Whether the kernel for `mode` takes this shape (other linears stay fp32)."""
    if mode == "int8":
        return in_features % K_MULTIPLE == 0
    return in_features % GROUP == 0 and out_features % N_MULTIPLE == 0


def quantize_model(model: nn.Module, mode: str, blocks: dict[str, GroupQuant] | None = None) -> int:
    """Replaces linears of `model` in place and returns how many. "int8" / "int4" quantize every
    packable linear from its fp32 weights; "auto" packs those whose weights `blocks` holds (HF names of
    an HF name per weight, as the loader reads them). A tied LM head gets its own packed copy of the embedding;
    the embedding itself stays fp32 for lookups."""
    if mode == "none":
        return 0
    replaced, fused = 0, fuse_blocks(blocks or {})
    for name, linear, weight_name in model_linears(model):
        weights = fused.get(weight_name) if mode == "auto" else None
        if mode == "auto" and weights is None or not packable(linear.weight.shape[0], linear.weight.shape[1], mode):
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, _packed_linear(linear.weight, linear.bias, mode, weights))
        replaced += 1
    return replaced


def model_linears(model: nn.Module) -> list[tuple[str, nn.Linear, str]]:
    """(module name, linear, name of its weight) for every linear, a tied LM head included."""
    found = [(name, m, f"{name}.weight") for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    embed = getattr(model, "embed_tokens", None)
    if getattr(model, "lm_head", False) is None and embed is not None:  # tied head: a linear over the embedding
        head = nn.Linear(embed.embedding_dim, embed.num_embeddings, bias=False, device="meta")
        head.weight = embed.weight
        found.append(("lm_head", head, "embed_tokens.weight"))
    return found


def fuse_blocks(blocks: dict[str, GroupQuant]) -> dict[str, GroupQuant]:
    """HF-named block weights keyed by the model's weights instead: q/k/v and gate/up rows stacked as the
    fp32 loader stacks them. A fused weight whose parts differ in type is left out (it stays fp32)."""
    fused: dict[str, dict[str | None, GroupQuant]] = {}
    for name, weights in blocks.items():
        target, part = packed_target(name.removeprefix("model."))
        fused.setdefault(target, {})[part] = weights
    out = {}
    for target, parts in fused.items():
        if None in parts:
            out[target] = parts[None]
            continue
        ordered = [parts[p] for p in packed_parts(target) if p in parts]
        if len(ordered) == len(packed_parts(target)) and len({p.bits for p in ordered}) == 1:
            out[target] = cat_rows(ordered)
    return out


def packed_linear_record(module: nn.Module) -> dict | None:
    """What rebuilds a packed linear from its saved state (None: not a packed linear)."""
    if isinstance(module, BlockLinear):
        return {"class": "BlockLinear", "attrs": {"in_features": module.in_features, "bits": module.bits}}
    if not isinstance(module, (Int8Linear, Int4Linear)):
        return None
    attrs = {"in_features": module.in_features, "repeats": module.repeats} if isinstance(module, Int4Linear) else {}
    if isinstance(module, Int4Linear):
        attrs["bits"] = module.bits
    return {"class": type(module).__name__, "attrs": attrs}


def packed_linear_from_state(record: dict, state: dict[str, torch.Tensor]) -> nn.Module:
    """A packed linear over already converted buffers (a weight cache entry): nothing is recomputed. An
    int4pack entry written while the block kernel was building kept its blocks: with the kernel loaded now it
    becomes a BlockLinear (the int4pack buffers stay registered, unread, so the entry's keys still match). A
    BlockLinear entry where the kernel is missing runs its dense copy at every row count."""
    if record["class"] == "Int4Linear" and "qweight" in state and block_kernel.available():
        record = {"class": "BlockLinear", "attrs": {"in_features": record["attrs"]["in_features"],
                                                    "bits": record["attrs"]["bits"]}}
    classes: dict[str, type[nn.Module]] = {"Int8Linear": Int8Linear, "Int4Linear": Int4Linear,
                                           "BlockLinear": BlockLinear}
    return _new(classes[record["class"]], record, state)


def _new(cls: type[nn.Module], record: dict, state: dict[str, torch.Tensor]) -> nn.Module:
    module: Int8Linear | Int4Linear | BlockLinear = cls.__new__(cls)  # type: ignore[assignment]
    nn.Module.__init__(module)
    for name, value in record["attrs"].items():
        setattr(module, name, value)
    if cls is BlockLinear:  # no kernel (a build gone, RADIXLANG_BLOCK_KERNEL=0): the dense copy throughout
        module.dense_min_rows = BLOCK_NEVER_DENSE if block_kernel.available() else 1
    else:
        module.dense_min_rows = dense_min_rows(record["attrs"].get("repeats", 1))
    for name, tensor in state.items():
        if name != "bias":
            module.register_buffer(name, tensor)
    _attach_packed_dense(module)
    module.bias = _bias(state.get("bias"))
    return module


def _packed_linear(weight: torch.Tensor, bias: torch.Tensor | None, mode: str,
                   blocks: GroupQuant | None) -> nn.Module:
    if mode == "int8":
        return Int8Linear(weight, bias)
    weights = blocks if blocks is not None else quantize_int4_rtn(weight)
    if block_kernel.available():
        return BlockLinear(weights, bias)
    # the kernel is building in the background (block_kernel.available started it): int4pack in this process
    return Int4Linear(weights, bias, keep_blocks=block_kernel.supported())


def pack_linear(weight: torch.Tensor, bias: torch.Tensor | None, mode: str) -> nn.Module:
    """A packed linear of `mode` over fp32 `weight`, as quantize_model packs one (a live weight update's re-pack:
    "auto" has no file blocks then, and rounds to int4 as "int4" does)."""
    return _packed_linear(weight, bias, mode, None)
