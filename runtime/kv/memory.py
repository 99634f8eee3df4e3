"""KV memory: token-granular slots, the per-request position->slot table, and the per-layer K/V pool."""
from __future__ import annotations

import math
import mmap
from dataclasses import dataclass
from itertools import pairwise

import torch

from ...kernels.backend import flat_runs, offsets
from ...kernels.kv_quant import SCALE_DTYPE, KVScales, is_quantized, storage_dtype

FEW_WRITES = 32  # up to this many runs, a slice assignment each costs less than one vectorized scatter


class SlotAllocator:
    """Hands out KV slot indices one token at a time; `free` takes them back. Freed slots queue behind the
    free list and join it only when an allocation reaches them, so a free costs O(its slots), not a copy
    of the whole list (many requests finish in one step); the order slots are handed out in is the same."""

    def __init__(self, num_slots: int, device: torch.device):
        self.num_slots = num_slots
        self.device = device
        self._free = torch.arange(num_slots, dtype=torch.int64, device=device)
        self._returned: list[torch.Tensor] = []  # freed since the last merge, in order
        self._num_returned = 0

    @property
    def num_free(self) -> int:
        return int(self._free.numel()) + self._num_returned

    def alloc(self, n: int) -> torch.Tensor | None:
        if n > self.num_free:
            return None
        if n > self._free.numel():
            self._merge()
        out, self._free = self._free[:n], self._free[n:]
        return out

    def free(self, slots: torch.Tensor) -> None:
        if slots.numel():
            self._returned.append(slots.to(self.device, torch.int64, copy=True))  # the caller may reuse its tensor
            self._num_returned += slots.numel()

    def free_slots(self) -> torch.Tensor:
        self._merge()
        return self._free

    def _merge(self) -> None:
        if self._returned:
            self._free = torch.cat((self._free, *self._returned))
            self._returned, self._num_returned = [], 0


class ReqToToken:
    """Row r, column p: the KV slot holding position p of the request that owns row r."""

    def __init__(self, max_reqs: int, max_context: int, device: torch.device):
        self.table = torch.zeros(max_reqs, max_context, dtype=torch.int32, device=device)
        self._free_rows = list(range(max_reqs))

    @property
    def num_free_rows(self) -> int:
        return len(self._free_rows)

    def alloc_row(self) -> int:
        return self._free_rows.pop()

    def free_row(self, row: int) -> None:
        self._free_rows.append(row)

    def write(self, row: int, start: int, slots: torch.Tensor) -> None:
        self.table[row, start : start + slots.numel()] = slots.to(torch.int32)

    def write_runs(self, rows: list[int], starts: list[int], lens: list[int], slots: torch.Tensor) -> None:
        """`write` of each run: run i (the next lens[i] of `slots`) goes to row rows[i] from column starts[i].
        Beyond a few runs, in one scatter, the host lists reaching the device in one copy."""
        if len(rows) <= FEW_WRITES:
            for row, start, (at, end) in zip(rows, starts, pairwise(offsets(lens))):
                self.write(row, start, slots[at:end])
            return
        host = torch.tensor([rows, starts, lens, offsets(lens)[:-1]], dtype=torch.int64)
        rows_t, starts_t, lens_t, first = host.to(self.table.device, non_blocking=True)
        cells = flat_runs(rows_t * self.table.shape[1] + starts_t - first, lens_t, slots.numel())
        self.table.view(-1).index_copy_(0, cells, slots.to(self.table.device, torch.int32))

    def read(self, row: int, start: int, end: int) -> torch.Tensor:
        return self.table[row, start:end].to(torch.int64)


@dataclass(slots=True)
class SwappedKV:
    """A request's K/V copied to host memory while it is preempted: one tensor per buffer group of the pool
    (`KVPool.groups`), stacked over layers: [layers, tokens, ...]."""

    groups: list[torch.Tensor]


def _zeros(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    nbytes = math.prod(shape) * dtype.itemsize
    if device.type != "cpu" or nbytes == 0 or not hasattr(mmap, "MAP_ANONYMOUS"):
        return torch.zeros(shape, dtype=dtype, device=device)
    # a private anonymous map: the kernel zeroes each page when it is first touched, so a big pool costs
    # nothing up front (calloc may reuse heap memory a model load freed and clear all of it: 0.3 s for the
    # default model's pool)
    buffer = mmap.mmap(-1, nbytes, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    return torch.frombuffer(buffer, dtype=dtype).view(shape)  # the tensor keeps the map alive


class KVPool:
    """Per-layer K and V buffers of shape [num_slots + 1, num_kv_heads, head_dim]: slot `pad_slot` (the
    last) belongs to no request; the padding rows of a fixed-size decode batch (CUDA graphs) write there.
    `shared_kv` (MLA's latent pool): V is the K buffer itself, one latent row per token and layer.
    A quantized pool (`kv_cache_dtype` int8 / fp8_e4m3, kernels/kv_quant.py) holds codes in those buffers and
    one scale per (slot, KV head) in `scales`."""

    def __init__(self, num_slots: int, num_layers: int, num_kv_heads: int, head_dim: int,
                 dtype: torch.dtype, device: torch.device, shared_kv: bool = False, kv_cache_dtype: str = "auto"):
        self.num_slots = num_slots
        self.pad_slot = num_slots
        self.shared_kv = shared_kv
        storage = storage_dtype(kv_cache_dtype, dtype)
        if shared_kv and is_quantized(storage):
            raise ValueError(f"kv_cache_dtype={kv_cache_dtype!r} is not supported for MLA's latent KV; use 'auto'")
        shape = (num_slots + 1, num_kv_heads, head_dim)
        self.k_buffers = [_zeros(shape, storage, device) for _ in range(num_layers)]
        self.v_buffers = self.k_buffers if shared_kv else [_zeros(shape, storage, device) for _ in range(num_layers)]
        self.scales: KVScales | None = None
        if is_quantized(storage):
            self.scales = KVScales(*([_zeros(shape[:2], SCALE_DTYPE, device) for _ in range(num_layers)]
                                     for _ in range(2)))

    @classmethod
    def elsewhere(cls, num_slots: int) -> KVPool:
        """The slots of a pool whose buffers another process holds (a DP-attention rank's): the KV owner
        here hands them out, and that rank's steps write and read them there."""
        return cls(num_slots, 0, 0, 0, torch.float32, torch.device("cpu"))

    @staticmethod
    def bytes_per_token(num_layers: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype,
                        shared_kv: bool = False, kv_cache_dtype: str = "auto") -> int:
        """Bytes of KV one token takes in a pool of compute dtype `dtype` (codes and scales when quantized)."""
        storage = storage_dtype(kv_cache_dtype, dtype)
        per_row = head_dim * storage.itemsize + (SCALE_DTYPE.itemsize if is_quantized(storage) else 0)
        per_buffer = num_layers * num_kv_heads * per_row
        return per_buffer if shared_kv else 2 * per_buffer

    @property
    def token_bytes(self) -> int:
        """Bytes of KV one token holds here."""
        return sum(buf[0].nbytes for group in self.groups() for buf in group)

    def groups(self) -> list[list[torch.Tensor]]:
        """Every per-layer buffer indexed by slot, in groups of one shape and dtype: K, V (not for a latent
        pool), then K and V scales (a quantized pool). What the host tier and swapping copy."""
        groups = [self.k_buffers] if self.shared_kv else [self.k_buffers, self.v_buffers]
        if self.scales is None:
            return groups
        # codes as their bytes: copies need no indexing kernel for float8 (not every device has one)
        return [*([buf.view(torch.uint8) for buf in group] for group in groups), self.scales.k, self.scales.v]

    def swap_out(self, slots: torch.Tensor) -> SwappedKV:
        return SwappedKV([torch.stack([buf[slots] for buf in group]).to("cpu") for group in self.groups()])

    def swap_in(self, slots: torch.Tensor, saved: SwappedKV) -> None:
        for group, stacked in zip(self.groups(), saved.groups, strict=True):
            for buf, layer in zip(group, stacked):
                buf[slots] = layer.to(buf.device)
