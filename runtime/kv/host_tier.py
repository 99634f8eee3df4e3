"""The host KV tier (SGLang's HiCache, one level down): KV evicted from the device pool parks in a larger
pool in host memory, indexed by a radix tree of its token paths; a later prompt that matches further
there than in the device tree gets those tokens copied back instead of recomputed.

Host slots follow the device invariant on their own: free + in the host tree = every host slot, once.
On CUDA the host buffers are pinned memory and copies are asynchronous (`AsyncDeviceToHost`; written for
CUDA and guarded by the device type, but tested only on the CPU); on the CPU both pools are RAM and a
copy still costs ~100x less than prefilling the tokens through every layer.

Also here: `EvictedPrefixes`, which remembers evicted token paths (no KV) so the engine can report the
tokens it recomputes that it had cached before, the figure retention exists to cut.
"""
from __future__ import annotations

from collections import deque

import torch

from ..namespace import DEFAULT_NAMESPACE, Namespace
from .memory import SlotAllocator
from .radix_cache import PrefixMatch, RadixCache


class EvictedPrefixes:
    """Token paths evicted from the device tree, up to `capacity` tokens (LRU beyond)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.tree = RadixCache(lambda slots: None)

    def record(self, path: list[int], namespace: Namespace = DEFAULT_NAMESPACE) -> None:
        self.tree.insert(path, torch.zeros(len(path), dtype=torch.int64), namespace)
        over = self.tree.total_size - self.capacity
        if over > 0:
            self.tree.evict(over)

    def seen(self, key: list[int], namespace: Namespace = DEFAULT_NAMESPACE) -> int:
        """How many leading tokens of `key` (in `namespace`) were cached once and evicted since."""
        return self.tree.match_prefix(key, namespace).length

    def clear(self) -> None:
        shared = self.tree.shared
        self.tree = RadixCache(lambda slots: None)
        self.tree.shared = shared


class AsyncDeviceToHost:
    """CUDA device -> host copies that do not stall the step: the KV is gathered on the compute stream (so
    it is read before its freed slots are reused), copied on a side stream into pinned staging, and
    scattered into the host pool once the copy is done (`settle`; before any read of the host pool)."""

    def __init__(self, device: torch.device):
        self.stream = torch.cuda.Stream(device)
        self.pending: deque[tuple[torch.cuda.Event, torch.Tensor, list[torch.Tensor], torch.Tensor]] = deque()

    def copy(self, dst: list[torch.Tensor], dst_slots: torch.Tensor, src: list[torch.Tensor],
             src_slots: torch.Tensor) -> None:
        gathered = torch.stack([buf[src_slots] for buf in src])
        staging = torch.empty(gathered.shape, dtype=gathered.dtype, pin_memory=True)
        self.stream.wait_stream(torch.cuda.current_stream(gathered.device))
        with torch.cuda.stream(self.stream):
            staging.copy_(gathered, non_blocking=True)
            done = torch.cuda.Event()
            done.record()
        gathered.record_stream(self.stream)  # its memory is not reused before the side stream read it
        self.pending.append((done, staging, dst, dst_slots))
        self.settle(wait=False)

    def settle(self, wait: bool = True) -> None:
        """Scatters finished copies into the host pool, in order (a host slot freed and parked again gets
        its latest KV); `wait`: every copy, waiting for those in flight."""
        while self.pending and (wait or self.pending[0][0].query()):
            done, staging, dst, dst_slots = self.pending.popleft()
            done.synchronize()
            for layer, buf in enumerate(dst):
                buf[dst_slots] = staging[layer]


class HostTier:
    """Host copies of a device pool's per-layer buffers, by group of one shape and dtype (`KVPool.groups`: K,
    V, and a quantized pool's scales), under a radix tree of their own."""

    def __init__(self, num_slots: int, groups: list[list[torch.Tensor]]):
        cpu = torch.device("cpu")
        cuda = groups[0][0].is_cuda

        def like(buf: torch.Tensor) -> torch.Tensor:
            # empty: a slot is read only after it was parked, and untouched pages of a big tier cost no RAM
            return torch.empty((num_slots, *buf.shape[1:]), dtype=buf.dtype, device=cpu, pin_memory=cuda)

        self.num_slots = num_slots
        self.groups = [[like(b) for b in group] for group in groups]
        # on CUDA copies out are asynchronous (pinned memory, a side stream); on the CPU a copy is a gather
        self.to_host = AsyncDeviceToHost(groups[0][0].device) if cuda else None
        self.allocator = SlotAllocator(num_slots, cpu)
        self.cache = RadixCache(self.allocator.free)
        self.parked_tokens = 0  # copied device -> host
        self.restored_tokens = 0  # copied host -> device: prefill not redone

    def match(self, key: list[int], namespace: Namespace = DEFAULT_NAMESPACE) -> PrefixMatch:
        return self.cache.match_prefix(key, namespace)

    def park(self, path: list[int], namespace: Namespace, device_slots: torch.Tensor,
             groups: list[list[torch.Tensor]]) -> None:
        """Copies the KV of `path` (at `device_slots` of the device buffer `groups`) that the host tier lacks in
        `namespace`; LRU host entries make room."""
        have = self.cache.match_prefix(path, namespace)
        need = len(path) - have.length
        if need <= 0 or need > self.num_slots:
            return
        self.cache.inc_lock_ref(have.node)  # making room must not evict the prefix extended here
        short = need - self.allocator.num_free
        if short > 0:
            self.cache.evict(short)
        self.cache.dec_lock_ref(have.node)
        slots = self.allocator.alloc(need)
        if slots is None:  # the rest of the host tier is locked: skip this one
            return
        src = device_slots[have.length:]
        for host, device in zip(self.groups, groups, strict=True):
            if self.to_host is not None:
                self.to_host.copy(host, slots, device, src)
            else:
                for dst, buf in zip(host, device):
                    dst[slots] = buf[src]
        present = self.cache.insert(path, torch.cat((have.slots, slots)), namespace)
        assert present == have.length, "the host prefix just matched must still be there"
        self.parked_tokens += need

    def restore(self, host_slots: torch.Tensor, device_slots: torch.Tensor, groups: list[list[torch.Tensor]]) -> None:
        """Copies host KV at `host_slots` into device `device_slots` (on CUDA: one asynchronous copy per
        buffer group from pinned staging, ordered before the step that reads it on the compute stream)."""
        for host, device in zip(self.groups, groups, strict=True):
            if self.to_host is not None:
                self.to_host.settle()
                staged = torch.stack([src[host_slots] for src in host]).pin_memory()
                moved = staged.to(device[0].device, non_blocking=True)
                for layer, buf in enumerate(device):
                    buf[device_slots] = moved[layer]
            else:
                for src, buf in zip(host, device):
                    buf[device_slots] = src[host_slots]
        self.restored_tokens += int(host_slots.numel())

    def flush(self) -> None:
        self.cache.evict(self.cache.total_size)

    def check(self) -> None:
        """free + in the host tree = every host slot, each exactly once; no host path is locked."""
        self.cache.check()
        assert self.cache.protected_size == 0, "a host-tier lock outlived its operation"
        parts = torch.cat((self.allocator.free_slots(), self.cache.all_slots()))
        counts = torch.bincount(parts, minlength=self.num_slots)
        assert counts.numel() == self.num_slots and bool((counts == 1).all()), "host KV slots leaked or doubled"
