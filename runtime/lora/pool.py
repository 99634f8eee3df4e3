"""The adapters an engine serves, and the device slots the running ones occupy (S-LoRA's unified pool, simply).

Every loaded adapter keeps its weights on the CPU; a step's adapters are copied into `num_slots` device slots
(max_loras_per_batch), the least recently used one giving way, and the step's rows gather them by slot
(kernels/lora.py). Slot 0 is the base model: no delta. The scheduler admits at most `num_slots` distinct
adapters into the running set, so one step never needs more.

Per layer the slots stack the fused linears' LoRA weights the way the model fuses the linears: q | k | v share
one input (A of rank 3R: q's rows, then k's, then v's; B block-diagonal, stored transposed [3R, out] as the
kernels take it), gate | up likewise (2R), o and down alone. R is max_lora_rank (default: the largest rank of the adapters given at start, else of the first one
loaded); smaller ranks are zero-padded, which adds exact zeros.

The token embedding and the LM head (runtime/lora/adapter.py's EMBEDDING / HEAD) have slots of their own, made when
the first adapter that has one is placed. The embedding's, in the activation dtype (PEFT's fp32 in the exact
mode): A transposed [slots, vocab, R] (a token's rank activations are its row: a gather, no matmul) and B^T [slots,
R, hidden], run by kernels/lora.py's lora_embedding_torch. The head's, as a linear's of the logits rows (A [slots,
R, hidden], B^T [slots, R, vocab], in the linears' dtype and path: int8 on the native CPU kernel in the default
mode, the Triton kernel on CUDA). Only the rows whose adapter has the target run them.

Everything here runs on the scheduler thread but `lookup` (a dict read, from the request's validation).
"""
from __future__ import annotations

import functools
import itertools
from dataclasses import dataclass
from typing import Callable

import torch

from ...kernels.lora import (
    lora_delta_cpu,
    lora_delta_torch,
    lora_embedding_torch,
    native_available,
    plan_rows,
    quantize_rows,
)
from ..models.llama import LlamaConfig
from . import UnknownAdapter
from .adapter import EMBEDDING, HEAD, LoraAdapter

# the model's fused linears and the PEFT targets each stacks, in its row order
GROUPS: dict[str, tuple[str, ...]] = {"qkv": ("q_proj", "k_proj", "v_proj"), "o": ("o_proj",),
                                     "gate_up": ("gate_proj", "up_proj"), "down": ("down_proj",)}


def _shapes(cfg: LlamaConfig) -> dict[str, tuple[int, tuple[int, ...]]]:
    """Each group's (input features, output rows per target)."""
    q, kv, h, i = cfg.num_heads * cfg.head_dim, cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size, cfg.intermediate_size
    return {"qkv": (h, (q, kv, kv)), "o": (q, (h,)), "gate_up": (h, (i, i)), "down": (i, (h,))}


@dataclass(slots=True)
class SlotWeights:
    """One fused linear's LoRA weights, stacked by slot: A [slots, G R, K] and B^T [slots, G R, N]."""

    a: torch.Tensor
    bt: torch.Tensor
    scales: tuple[torch.Tensor, torch.Tensor] | None = None  # int8 a / bt: fp32 [slots, G R] each (quantize_rows)


# (y, x, the weights, the group's target column bounds) -> y plus each row's delta: one step's rows bound in
Delta = Callable[[torch.Tensor, torch.Tensor, SlotWeights, list[int]], torch.Tensor]
# (logits, hidden, the head's weights, each row's slot) -> logits plus each row's delta
HeadDelta = Callable[[torch.Tensor, torch.Tensor, SlotWeights, list[int]], torch.Tensor]


@dataclass(slots=True)
class LoraBatch:
    """One step's adapter rows (ForwardContext.lora): adds each row's delta to a fused linear's output."""

    weights: dict[tuple[int, str], SlotWeights]  # by (layer, group)
    columns: dict[str, list[int]]  # each group's target column bounds
    delta: Delta
    head_delta: HeadDelta | None = None  # the head's path: the linears' (native, or tiled)
    embedding: SlotWeights | None = None  # the embedding's slots (None: no adapter of the step has one)
    embedding_slots: list[int] | None = None  # each token's slot for the embedding (0: its adapter has none)
    head: SlotWeights | None = None  # the LM head's, likewise
    head_slots: list[int] | None = None

    def add(self, layer: int, group: str, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.delta(y, x, self.weights[(layer, group)], self.columns[group])

    def embed(self, input_ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
        """x [T, hidden], the step's embeddings, plus each token's embedding delta (its adapter's B A[:, id])."""
        plan = None if self.embedding_slots is None else plan_rows(self.embedding_slots, x.device)
        if plan is None or self.embedding is None:
            return x
        return lora_embedding_torch(x, input_ids, self.embedding.a, self.embedding.bt, plan)

    def logits(self, rows: list[int], hidden: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
        """logits [len(rows), vocab] of hidden [len(rows), hidden] (the step's tokens `rows`), plus the LM head's
        delta of each row whose adapter has one."""
        slots = [] if self.head_slots is None else [self.head_slots[r] for r in rows]
        if not any(slots) or self.head is None or self.head_delta is None:
            return logits
        return self.head_delta(logits, hidden, self.head, slots)


def _tiled(delta: Callable, plan, y: torch.Tensor, x: torch.Tensor, w: SlotWeights, columns: list[int]) -> torch.Tensor:
    return delta(y, x, w.a, w.bt, plan)  # the tiled paths run the whole block-diagonal B


def _native(slots: torch.Tensor, y: torch.Tensor, x: torch.Tensor, w: SlotWeights, columns: list[int]) -> torch.Tensor:
    return lora_delta_cpu(y, x, w.a, w.bt, slots, columns, w.scales)


def _head_native(y: torch.Tensor, x: torch.Tensor, w: SlotWeights, slots: list[int]) -> torch.Tensor:
    return lora_delta_cpu(y, x, w.a, w.bt, torch.tensor(slots), [0, y.shape[1]], w.scales)


def _head_tiled(delta: Callable, y: torch.Tensor, x: torch.Tensor, w: SlotWeights, slots: list[int]) -> torch.Tensor:
    plan = plan_rows(slots, x.device)
    assert plan is not None
    return delta(y, x, w.a, w.bt, plan)


class LoraPool:
    def __init__(self, cfg: LlamaConfig, num_slots: int, max_rank: int | None, device: torch.device,
                 dtype: torch.dtype, exact: bool = False):
        self.cfg, self.num_slots, self.max_rank = cfg, num_slots, max_rank
        self.device = device
        # the CPU's native delta, decided once (a build landing later changes no running engine's numbers); its
        # default mode keeps the adapters in int8 with a scale per rank row (a quarter of the bytes a decode step
        # reads: 8 adapters of rank 16 in fp32 outweigh the base's 4-bit blocks 4x), the exact mode in fp32
        # (PEFT's). Elsewhere the weights are in the activation dtype.
        self.native = device.type == "cpu" and dtype == torch.float32 and native_available()
        self.dtype = torch.int8 if self.native and not exact else dtype
        self.shapes = _shapes(cfg)
        self.columns = {group: [sum(outs[:j]) for j in range(len(outs) + 1)] for group, (_, outs) in self.shapes.items()}
        self.adapters: dict[str, LoraAdapter] = {}  # by name: what requests may name
        self.slots: list[LoraAdapter | None] = [None] * (num_slots + 1)  # [0]: the base model
        self.weights: dict[tuple[int, str], SlotWeights] = {}  # allocated at the first load
        self.float_dtype = dtype  # the embedding's slots (activations'); the LM head's are the linears'
        self.whole: dict[str, SlotWeights] = {}  # EMBEDDING / HEAD: allocated when an adapter first has one
        self._uids = itertools.count(1)
        self._steps = 0
        self._delta = lora_delta_torch  # the Triton kernel on CUDA (the same plan and result, in place)
        if device.type == "cuda":
            from ...kernels.triton.lora import lora_delta_triton

            self._delta = lora_delta_triton

    # ---- the adapters ---------------------------------------------------------------------------
    def lookup(self, name: str) -> LoraAdapter:
        adapter = self.adapters.get(name)
        if adapter is None:
            raise UnknownAdapter(name, list(self.adapters))
        return adapter

    def add(self, adapter: LoraAdapter) -> None:
        """Serves `adapter` under its name; ValueError if the name is taken or it does not fit the model."""
        if adapter.name in self.adapters:
            raise ValueError(f"LoRA adapter {adapter.name!r} is already loaded; unload it first")
        self._check_shapes(adapter)
        if self.max_rank is None:
            self.max_rank = adapter.rank
        if adapter.rank > self.max_rank:
            raise ValueError(f"LoRA adapter {adapter.name!r} has rank {adapter.rank}, above max_lora_rank "
                             f"{self.max_rank}; start the engine with max_lora_rank >= {adapter.rank}")
        adapter.uid = next(self._uids)
        self.adapters[adapter.name] = adapter

    def remove(self, name: str) -> LoraAdapter:
        """Stops serving `name` to new requests; it frees now if no request runs it, else at its last `release`."""
        adapter = self.lookup(name)
        del self.adapters[name]
        adapter.retired = True
        self._free_if_idle(adapter)
        return adapter

    def release(self, adapter: LoraAdapter) -> bool:
        """A request of `adapter` ended; True when that freed a retired adapter (its slot is free again)."""
        adapter.users -= 1
        return self._free_if_idle(adapter)

    def _free_if_idle(self, adapter: LoraAdapter) -> bool:
        if not adapter.retired or adapter.users > 0:
            return False
        if adapter.slot and self.slots[adapter.slot] is adapter:
            self.slots[adapter.slot] = None
        adapter.slot = 0
        return True

    def _check_shapes(self, adapter: LoraAdapter) -> None:
        vocab, hidden = self.cfg.vocab_size, self.cfg.hidden_size
        for target, shape in adapter.base_copies.items():
            if shape != (vocab, hidden):
                raise ValueError(f"LoRA adapter {adapter.name!r} holds a {target} of shape {list(shape)}, the model's "
                                 f"is {[vocab, hidden]} (a resized vocabulary, or another base model)")
        for (layer, target), (a, b) in adapter.weights.items():
            if layer < 0:  # the embedding's A is [r, vocab], B [hidden, r]; the head's A [r, hidden], B [vocab, r]
                fan_in, fan_out = (vocab, hidden) if target == EMBEDDING else (hidden, vocab)
                if a.shape[1] != fan_in or b.shape[0] != fan_out:
                    raise ValueError(f"LoRA adapter {adapter.name!r}: {target} maps {a.shape[1]} -> {b.shape[0]}, "
                                     f"the model's {fan_in} -> {fan_out} (another base model?)")
                continue
            if layer >= self.cfg.num_layers:
                raise ValueError(f"LoRA adapter {adapter.name!r} has layer {layer}; the model has "
                                 f"{self.cfg.num_layers}")
            group = next(g for g, targets in GROUPS.items() if target in targets)
            fan_in, outs = self.shapes[group]
            fan_out = outs[GROUPS[group].index(target)]
            if a.shape[1] != fan_in or b.shape[0] != fan_out:
                raise ValueError(f"LoRA adapter {adapter.name!r}: layer {layer} {target} maps {a.shape[1]} -> "
                                 f"{b.shape[0]}, the model's {fan_in} -> {fan_out} (another base model?)")

    # ---- one step -------------------------------------------------------------------------------
    def step(self, adapters: list[LoraAdapter | None], lengths: list[int]) -> LoraBatch | None:
        """The step's LoraBatch: item i runs adapters[i] (None: the base) over lengths[i] tokens; None when
        no item has an adapter. Places the step's adapters in slots first."""
        present = {id(a): a for a in adapters if a is not None}
        if not present:
            return None
        self._steps += 1
        for adapter in present.values():
            if not adapter.slot or self.slots[adapter.slot] is not adapter:
                self._place(adapter, present)
            adapter.last_used = self._steps
        slots = [0 if a is None else a.slot for a in adapters]
        rows = [s for s, n in zip(slots, lengths) for _ in range(n)]
        if self.native:
            batch = LoraBatch(self.weights, self.columns, functools.partial(_native, torch.tensor(rows)))
        else:
            plan = plan_rows(rows, self.device)
            assert plan is not None
            batch = LoraBatch(self.weights, self.columns, functools.partial(_tiled, self._delta, plan))
        batch.embedding, batch.embedding_slots = self._whole_rows(EMBEDDING, adapters, lengths)
        batch.head, batch.head_slots = self._whole_rows(HEAD, adapters, lengths)
        batch.head_delta = _head_native if self.native else functools.partial(_head_tiled, self._delta)
        return batch

    def _whole_rows(self, target: str, adapters: list[LoraAdapter | None], lengths: list[int]
                    ) -> tuple[SlotWeights | None, list[int] | None]:
        """The embedding's or head's slots and each token's slot in them (0: its adapter has no `target`), or
        (None, None) when no adapter of the step has one."""
        slots = [a.slot if a is not None and (-1, target) in a.weights else 0 for a in adapters]
        if not any(slots):
            return None, None
        return self.whole[target], [s for s, n in zip(slots, lengths) for _ in range(n)]

    def _place(self, adapter: LoraAdapter, present: dict[int, LoraAdapter]) -> None:
        free = [i for i in range(1, len(self.slots)) if self.slots[i] is None]
        if free:
            slot = free[0]
        else:  # the least recently used adapter not in this step gives its slot way
            candidates = [i for i in range(1, len(self.slots)) if id(self.slots[i]) not in present]
            assert candidates, "the scheduler admits at most max_loras_per_batch adapters"
            slot = min(candidates, key=lambda i: self.slots[i].last_used)  # type: ignore[union-attr]
            self.slots[slot].slot = 0  # type: ignore[union-attr]
        if not self.weights:
            self._allocate()
        self._write(slot, adapter)
        self._write_whole(slot, adapter)
        self.slots[slot], adapter.slot = adapter, slot

    def _allocate(self) -> None:
        assert self.max_rank is not None
        n = self.num_slots + 1
        for layer in range(self.cfg.num_layers):
            for group, (fan_in, outs) in self.shapes.items():
                rank = self.max_rank * len(outs)
                scales = None
                if self.dtype == torch.int8:
                    scales = (torch.zeros(n, rank, device=self.device), torch.zeros(n, rank, device=self.device))
                self.weights[(layer, group)] = SlotWeights(
                    torch.zeros(n, rank, fan_in, dtype=self.dtype, device=self.device),
                    torch.zeros(n, rank, sum(outs), dtype=self.dtype, device=self.device), scales)  # B^T: bmm's

    def _write(self, slot: int, adapter: LoraAdapter) -> None:
        r_max = self.max_rank
        assert r_max is not None
        for layer in range(self.cfg.num_layers):
            for group, targets in GROUPS.items():
                w = self.weights[(layer, group)]
                a_slot = torch.zeros(w.a.shape[1:])  # fp32, on the host: then stored in the slots' dtype
                b_slot = torch.zeros(w.bt.shape[1:])
                row = 0
                for j, target in enumerate(targets):
                    out = self.shapes[group][1][j]
                    ab = adapter.weights.get((layer, target))
                    if ab is not None:
                        a, b = ab
                        a_slot[j * r_max:j * r_max + adapter.rank] = a
                        b_slot[j * r_max:j * r_max + adapter.rank, row:row + out] = b.T
                    row += out
                self._store(w, slot, a_slot, b_slot)

    def _write_whole(self, slot: int, adapter: LoraAdapter) -> None:
        """The adapter's embedding and head into their slots (zero-padded to max_lora_rank). An adapter without one
        leaves its slot stale: its rows never read it (LoraBatch's embedding_slots / head_slots say 0)."""
        assert self.max_rank is not None
        for target in (EMBEDDING, HEAD):
            ab = adapter.weights.get((-1, target))
            if ab is None:
                continue
            a, b = ab
            if target not in self.whole:
                self.whole[target] = self._allocate_whole(target, a.shape[1], b.shape[0])
            w = self.whole[target]
            a_slot = torch.zeros(w.a.shape[1:])
            if target == EMBEDDING:  # transposed: a token's rank activations are one row
                a_slot[:, :adapter.rank] = a.T
            else:
                a_slot[:adapter.rank] = a
            bt_slot = torch.zeros(w.bt.shape[1:])
            bt_slot[:adapter.rank] = b.T
            if target == EMBEDDING:
                w.a[slot], w.bt[slot] = a_slot.to(self.device, w.a.dtype), bt_slot.to(self.device, w.bt.dtype)
            else:
                self._store(w, slot, a_slot, bt_slot)

    def _allocate_whole(self, target: str, fan_in: int, fan_out: int) -> SlotWeights:
        """The embedding's slots in the activation dtype; the head's as a linear's (int8 with scales on the native
        CPU kernel in the default mode)."""
        n, rank = self.num_slots + 1, self.max_rank
        assert rank is not None
        if target == EMBEDDING:
            return SlotWeights(torch.zeros(n, fan_in, rank, dtype=self.float_dtype, device=self.device),
                               torch.zeros(n, rank, fan_out, dtype=self.float_dtype, device=self.device))
        scales = None
        if self.dtype == torch.int8:
            scales = (torch.zeros(n, rank, device=self.device), torch.zeros(n, rank, device=self.device))
        return SlotWeights(torch.zeros(n, rank, fan_in, dtype=self.dtype, device=self.device),
                           torch.zeros(n, rank, fan_out, dtype=self.dtype, device=self.device), scales)

    def _store(self, w: SlotWeights, slot: int, a: torch.Tensor, bt: torch.Tensor) -> None:
        if w.scales is None:
            w.a[slot], w.bt[slot] = a.to(self.device, self.dtype), bt.to(self.device, self.dtype)
            return
        (w.a[slot], w.scales[0][slot]), (w.bt[slot], w.scales[1][slot]) = quantize_rows(a), quantize_rows(bt)
