"""New weights into a serving model, in place: every tensor the model computes with is copied into, never replaced.

In-place copies keep each tensor's storage, so whatever holds a pointer to it stays valid and reads the new
values: captured CUDA graphs (execution/cuda_graph.py), the compiled decode forward (models/compiled.py), a
module's oneDNN-packed copy (an opaque tensor, which `copy_` also fills). A checkpoint update loads the new model
whole with the engine's own loader (so its quantization mode is re-applied exactly as a fresh start would),
checks that it matches the serving one tensor for tensor, and only then copies: a mismatch leaves the old
weights untouched. A tensor update (`apply_named_tensors`) takes HF-named tensors, as SGLang's
update_weights_from_tensor does, and changes only those.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Iterable

import torch
from torch import nn

from ...distributed.layers import load_shard
from ..linear.quant import pack_linear, packed_linear_record
from ..llama import packed_parts, packed_target


def model_tensors(model: nn.Module) -> dict[str, torch.Tensor]:
    """Every tensor the model computes with by name: parameters and buffers, non-persistent ones included (a
    packed linear's oneDNN copy, rotary tables), which a state_dict leaves out."""
    tensors: dict[str, torch.Tensor] = dict(model.named_parameters(remove_duplicate=False))
    tensors |= dict(model.named_buffers(remove_duplicate=False))
    return {name: t for name, t in tensors.items() if t is not None}


def check_same_model(old: nn.Module, new: nn.Module) -> None:
    """ValueError naming the first difference that an in-place copy cannot bridge: a module's kind (a packed
    linear against a plain one), a tensor's name, shape or dtype, the config."""
    new_modules = dict(new.named_modules())
    for name, module in old.named_modules():
        other = new_modules.get(name)
        if other is not None and type(other) is not type(module):
            raise ValueError(f"module {name!r} is a {type(other).__name__} in the new weights, a "
                             f"{type(module).__name__} in the serving model (a different quantization or format)")
    check_same_tensors(model_tensors(old), model_tensors(new))
    _check_config(getattr(old, "config", None), getattr(new, "config", None))  # what no tensor shows (eps, RoPE)


def check_same_tensors(old: dict[str, torch.Tensor], new: dict[str, torch.Tensor]) -> None:
    missing, extra = sorted(set(old) - set(new)), sorted(set(new) - set(old))
    if missing or extra:
        raise ValueError(f"the new weights' tensors differ: missing {missing[:5]}, unexpected {extra[:5]}")
    for name, t in old.items():
        if t.shape != new[name].shape:
            raise ValueError(f"tensor {name!r} has shape {tuple(new[name].shape)} in the new weights, "
                             f"{tuple(t.shape)} in the serving model")
        if t.dtype != new[name].dtype:
            raise ValueError(f"tensor {name!r} has dtype {new[name].dtype} in the new weights, {t.dtype} in the "
                             "serving model")


def _check_config(old: object, new: object) -> None:
    if not dataclasses.is_dataclass(old) or not dataclasses.is_dataclass(new) or type(old) is not type(new):
        return
    for f in dataclasses.fields(old):
        a, b = getattr(old, f.name), getattr(new, f.name)
        if a != b:
            raise ValueError(f"the new model's config differs: {f.name} is {b!r}, the serving model's {a!r}")


@torch.no_grad()
def copy_model(old: nn.Module, new: nn.Module) -> None:
    """Copies every tensor of `new` into `old`'s (check_same_model first)."""
    targets = model_tensors(old)
    for name, t in model_tensors(new).items():
        targets[name].copy_(t)


@dataclass(slots=True)
class TensorUpdate:
    """A checked update_weights_from_tensor: what `apply` writes (in place) and the packed linears it re-packs."""

    model: nn.Module
    writes: list[tuple[torch.Tensor, torch.Tensor]]  # (the model's tensor or rows of it, the new values)
    repacks: list[tuple[str, nn.Module]]  # (a packed linear's name, the same linear packed from the new weights)
    count: int  # the named tensors taken

    @torch.no_grad()
    def apply(self) -> None:
        for name, module in self.repacks:  # first: a bias sent beside the weight is written after, over the repack's
            copy_model(self.model.get_submodule(name), module)
        for dst, src in self.writes:
            dst.copy_(src)


def plan_named_tensors(model: nn.Module, named_tensors: Iterable[tuple[str, torch.Tensor]], mode: str) -> TensorUpdate:
    """SGLang's update_weights_from_tensor, checked before anything changes (ValueError naming the tensor): HF
    names; a plain weight or a row block of a fused one (q/k/v, gate/up) is copied in place, and a packed linear
    of `mode` (quant.py's modes) is re-packed from its new fp32 weight, which must then come whole (every
    part of a fused one). Only the named tensors change."""
    given = [(name.removeprefix("model."), tensor) for name, tensor in named_tensors]
    tied = tied_head(model)
    given = [(name, t) for name, t in given if not (tied and name == "lm_head.weight")]  # as load_weights skips it
    plain, fused = _group(given)
    params: dict[str, torch.Tensor] = dict(model.named_parameters())
    writes: list[tuple[torch.Tensor, torch.Tensor]] = []
    repacks: list[tuple[str, nn.Module]] = []
    with torch.no_grad():
        for name, tensor in plain.items():
            writes += _plain_write(model, params, name, tensor, mode, repacks)
        for target, parts in fused.items():
            writes += _fused_write(model, params, target, parts, mode, repacks)
        head = getattr(model, "lm_head", None)
        if tied and "embed_tokens.weight" in plain and head is not None and packed_linear_record(head):
            repacks.append(("lm_head", pack_linear(_fp32(plain["embed_tokens.weight"]), None, mode)))
    for name, module in repacks:
        check_same_tensors(model_tensors(model.get_submodule(name)), model_tensors(module))
    return TensorUpdate(model, writes, repacks, len(given))


def tied_head(model: nn.Module) -> bool:
    """Whether the LM head computes with the embedding (quantize_model gives a tied head a packed copy of it)."""
    config = getattr(model, "config", None)
    return bool(getattr(config, "tie_word_embeddings", False))


Parts = dict[str, tuple[str, torch.Tensor]]  # a fused weight's parts given: part -> (HF name, tensor)


def _group(given: list[tuple[str, torch.Tensor]]) -> tuple[dict[str, torch.Tensor], dict[str, Parts]]:
    """The tensors by what they load into: a weight of its own, or a part of a fused one."""
    plain: dict[str, torch.Tensor] = {}
    fused: dict[str, Parts] = {}
    for name, tensor in given:
        target, part = packed_target(name)
        if part is None:
            plain[name] = tensor
        else:
            fused.setdefault(target, {})[part] = (name, tensor)
    return plain, fused


def _plain_write(model: nn.Module, params: dict[str, torch.Tensor], name: str, tensor: torch.Tensor, mode: str,
                 repacks: list[tuple[str, nn.Module]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    owner, _, attr = name.rpartition(".")
    if name not in params:
        module = _submodule(model, owner, name)
        if packed_linear_record(module) is None:
            raise ValueError(f"unknown weight {name!r} for this model")
        if attr != "weight":  # a packed linear's bias comes with its weight
            raise ValueError(f"weight {name!r} is part of a packed linear: send {owner}.weight with it")
        bias = getattr(module, "bias", None)
        repacks.append((owner, pack_linear(_fp32(load_shard(model, name, tensor)), bias, mode)))
        return []
    try:
        shard = load_shard(model, name, tensor)
    except RuntimeError:  # a tensor-parallel shard of the wrong whole shape
        raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, which does not shard to the model's "
                         f"{tuple(params[name].shape)}") from None
    return [(params[name], _shaped(params[name], shard, name))]


def _fused_write(model: nn.Module, params: dict[str, torch.Tensor], target: str, parts: Parts,
                 mode: str, repacks: list[tuple[str, nn.Module]]) -> list[tuple[torch.Tensor, torch.Tensor]]:
    order = packed_parts(target)
    owner, _, attr = target.rpartition(".")
    if target not in params:  # a packed linear: its new weight is the whole stack of its parts
        module = _submodule(model, owner, target)
        missing = [p for p in order if p not in parts]
        if packed_linear_record(module) is None or attr != "weight":
            raise ValueError(f"weights {sorted(parts)} of {target!r} cannot be updated in this model")
        if missing:
            raise ValueError(f"{target!r} is a packed {mode} linear: its update needs every part {list(order)}, "
                             f"missing {missing}")
        weight = torch.cat([_fp32(parts[p][1]) for p in order])
        repacks.append((owner, pack_linear(load_shard(model, target, weight), getattr(module, "bias", None), mode)))
        return []
    param = params[target]
    rows = _part_rows(model, target, order, param.shape[0])
    shard_part = getattr(model.get_submodule(owner), "shard_part", None)  # a tensor-parallel linear's
    writes = []
    for part, (name, tensor) in parts.items():
        start, stop = rows[part]
        dst = param[start:stop]
        if shard_part is not None:  # the HF tensor is whole: this rank's rows of it
            try:
                tensor = shard_part(order.index(part), tensor)
            except ValueError as e:
                raise ValueError(f"weight {name!r} {e}") from None
        writes.append((dst, _shaped(dst, tensor, name)))
    return writes


def _part_rows(model: nn.Module, target: str, order: tuple[str, ...], rows: int) -> dict[str, tuple[int, int]]:
    """Each part's rows in a fused weight or bias of this rank: q | k | v by the attention's sizes (this rank's
    heads), gate | up in halves."""
    block = model.get_submodule(target.rsplit(".", 2)[0])  # the attention or MLP the fused linear is in
    q, kv = getattr(block, "q_size", 0), getattr(block, "kv_size", 0)
    sizes = [q, kv, kv] if len(order) == 3 else [rows // 2] * 2
    bounds, start = {}, 0
    for part, size in zip(order, sizes):
        bounds[part] = (start, start + size)
        start += size
    return bounds


def _fp32(tensor: torch.Tensor) -> torch.Tensor:
    """A new weight as a packed linear takes it: fp32, on the CPU (quant.py's packed linears are CPU kernels)."""
    return tensor.detach().to("cpu", torch.float32)


def _submodule(model: nn.Module, owner: str, name: str) -> nn.Module:
    try:
        return model.get_submodule(owner)
    except AttributeError:
        raise ValueError(f"unknown weight {name!r} for this model") from None


def _shaped(dst: torch.Tensor, tensor: torch.Tensor, name: str) -> torch.Tensor:
    if tuple(dst.shape) != tuple(tensor.shape):
        raise ValueError(f"weight {name!r} has shape {tuple(tensor.shape)}, the model's is {tuple(dst.shape)}")
    return tensor.to(dst.device, dst.dtype)
