"""The default mode's block-quantized linears under tensor parallelism, bitwise equal to one rank's.

The block kernel (quant.BlockLinear) computes each output feature on its own: the activations are quantized per
row and block of 32 inputs, each block's integer dot product is exact, and the feature's float sum runs over its
blocks in one order, whatever the other features of the call. So a rank that holds some output features with
their whole K computes the same bits for them as one rank holding all of them. Every linear is split that way:
- column-parallel (qkv, gate_up): this rank's heads / channels, by the fp32 path's Part rules (no communication);
- row-parallel (o_proj, down_proj): the fp32 path splits K and all-reduces partial sums, a float sum in another
  order than one rank's. Here each rank all-gathers the input features (rank order is their order: the heads and
  channels split evenly), computes its slice of the output features over the whole K, and all-gathers those;
- the LM head (tied or not): this rank's slice of the vocabulary, zero rows padding the last rank's.
The embedding's all-reduce adds zeros to one rank's row (exact), attention is per head, and the norms and the
residual run on the whole hidden state on every rank: a TP N model's logits equal TP 1's bit for bit.

A shard keeps the layout its whole tensor runs at one rank (block_kernel.interleaves: the interleaved and rows
layouts round differently), padded with zero rows to the interleaved layout's 16 features where it splits them.
"""
from __future__ import annotations

import logging
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn

from ....kernels.cpu import block_kernel
from ....kernels.cpu.gguf_blocks import GroupQuant
from ...distributed.group import TensorParallel
from ...distributed.layers import ColumnParallelLinear, RowParallelLinear, shard_vocab
from .quant import BlockLinear, fuse_blocks, model_linears, packable

logger = logging.getLogger(__name__)


class ShardedBlockLinear(nn.Module):
    """A BlockLinear over this rank's output features (`features` of them; the rest of its rows are padding).
    `gathered` (row-parallel): the input's features are all-gathered first and the output's after."""

    def __init__(self, block: BlockLinear, features: int, tp: TensorParallel, gathered: bool):
        super().__init__()
        self.block, self.features, self.tp, self.gathered = block, features, tp, gathered

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.gathered:
            x = self.tp.all_gather(x, dim=-1)
        out = self.block(x)
        if out.shape[-1] != self.features:
            out = out[..., :self.features]
        return self.tp.all_gather(out, dim=-1) if self.gathered else out


def shard_block_linears(model: nn.Module, tp: TensorParallel, blocks: dict[str, GroupQuant]) -> int:
    """"auto" under tensor parallelism: replaces each linear whose weights `blocks` holds (HF names, whole
    tensors, as quant.quantize_model takes them) by this rank's ShardedBlockLinear; returns how many. The same
    linears as at one rank: packable by the whole tensor's shape."""
    if blocks and not block_kernel.available(wait=True):  # every rank builds or fails alike: all stay fp32
        logger.warning("the block_mm kernel is unavailable: the ranks run the GGUF's weights in fp32")
        return 0
    replaced, fused = 0, fuse_blocks(blocks)
    for name, linear, weight_name in model_linears(model):
        weights = fused.get(weight_name)
        if weights is None or not packable(weights.codes.shape[0], weights.codes.shape[1], "auto"):
            continue
        parent, _, attr = name.rpartition(".")
        setattr(model.get_submodule(parent), attr, _sharded(name, linear, weights, tp))
        replaced += 1
    return replaced


def _sharded(name: str, linear: nn.Linear, weights: GroupQuant, tp: TensorParallel) -> ShardedBlockLinear:
    interleaved = block_kernel.interleaves(weights)
    bias: torch.Tensor | None = linear.bias
    if isinstance(linear, RowParallelLinear):  # this rank's output features, the whole K
        n = weights.codes.shape[0] // tp.size
        shard, gathered = _map(weights, lambda t: t[tp.rank * n:(tp.rank + 1) * n]), True
        if bias is not None and not linear.gathered:  # a gathered linear's bias is already this rank's
            bias = bias[tp.rank * n:(tp.rank + 1) * n]
    elif isinstance(linear, ColumnParallelLinear):  # the bias is already this rank's
        shard, gathered = _map(weights, lambda t: linear.shard("weight", t)), False
    else:  # the LM head, tied to the embedding or not (no bias)
        assert name == "lm_head", f"{name}: no tensor-parallel rule for a {type(linear).__name__}"
        shard, gathered = _map(weights, lambda t: shard_vocab(t, tp)), False
    features = shard.codes.shape[0]
    pad = -features % block_kernel.interleave() if interleaved else 0
    if pad:
        shard = _map(shard, lambda t: F.pad(t, (0, 0, 0, pad)))
        bias = None if bias is None else F.pad(bias, (0, pad))
    return ShardedBlockLinear(BlockLinear(shard, bias, interleaved), features, tp, gathered)


def _map(w: GroupQuant, rows_of: Callable[[torch.Tensor], torch.Tensor]) -> GroupQuant:
    """`w` with `rows_of` applied to each of its [N, ...] tensors (the same rows of each)."""
    return GroupQuant(rows_of(w.codes), rows_of(w.scale), rows_of(w.minimum), w.bits)
