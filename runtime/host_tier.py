"""The host KV tier (SGLang's HiCache, one level down): KV evicted from the device pool parks in a larger
pool in host memory, indexed by a radix tree of its token paths; a later prompt that matches further
there than in the device tree gets those tokens copied back instead of recomputed.

Host slots follow the device invariant on their own: free + in the host tree = every host slot, once.
On CUDA the host buffers are pinned memory (copies are DMA, not pageable staging); on the CPU both
pools are RAM and a copy still costs ~100x less than prefilling the tokens through every layer.

Also here: `EvictedPrefixes`, which remembers evicted token paths (no KV) so the engine can report the
tokens it recomputes that it had cached before, the figure retention exists to cut.
"""
from __future__ import annotations

import torch

from .radix_cache import PrefixMatch, RadixCache
from .memory import SlotAllocator


class EvictedPrefixes:
    """Token paths evicted from the device tree, up to `capacity` tokens (LRU beyond)."""

    def __init__(self, capacity: int):
        self.capacity = capacity
        self.tree = RadixCache(lambda slots: None)

    def record(self, path: list[int]) -> None:
        self.tree.insert(path, torch.zeros(len(path), dtype=torch.int64))
        over = self.tree.total_size - self.capacity
        if over > 0:
            self.tree.evict(over)

    def seen(self, key: list[int]) -> int:
        """How many leading tokens of `key` were cached once and evicted since."""
        return self.tree.match_prefix(key).length


class HostTier:
    def __init__(self, num_slots: int, k_buffers: list[torch.Tensor], v_buffers: list[torch.Tensor]):
        cpu = torch.device("cpu")
        pin = torch.cuda.is_available() and k_buffers[0].is_cuda

        def like(buf: torch.Tensor) -> torch.Tensor:
            return torch.zeros((num_slots, *buf.shape[1:]), dtype=buf.dtype, device=cpu, pin_memory=pin)

        self.num_slots = num_slots
        self.k = [like(b) for b in k_buffers]
        self.v = self.k if v_buffers is k_buffers else [like(b) for b in v_buffers]  # MLA: one latent buffer
        self.allocator = SlotAllocator(num_slots, cpu)
        self.cache = RadixCache(self.allocator.free)
        self.parked_tokens = 0  # copied device -> host
        self.restored_tokens = 0  # copied host -> device: prefill not redone

    def match(self, key: list[int]) -> PrefixMatch:
        return self.cache.match_prefix(key)

    def park(self, path: list[int], device_slots: torch.Tensor, k_buffers: list[torch.Tensor],
             v_buffers: list[torch.Tensor]) -> None:
        """Copies the KV of `path` (at `device_slots`) that the host tier lacks; LRU host entries make room."""
        have = self.cache.match_prefix(path)
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
        for dst_list, src_list in ((self.k, k_buffers), (self.v, v_buffers)):
            for dst, buf in zip(dst_list, src_list):
                dst[slots] = buf[src].to("cpu", non_blocking=False)
        present = self.cache.insert(path, torch.cat((have.slots, slots)))
        assert present == have.length, "the host prefix just matched must still be there"
        self.parked_tokens += need

    def restore(self, host_slots: torch.Tensor, device_slots: torch.Tensor, k_buffers: list[torch.Tensor],
                v_buffers: list[torch.Tensor]) -> None:
        """Copies host KV at `host_slots` into device `device_slots`."""
        for src_list, dst_list in ((self.k, k_buffers), (self.v, v_buffers)):
            for src, buf in zip(src_list, dst_list):
                buf[device_slots] = src[host_slots].to(buf.device, non_blocking=False)
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
