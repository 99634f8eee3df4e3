"""KV memory writes batched over requests: ReqToToken.write_runs against one `write` per run, and
KVManager.extend_all against one `extend` per request (the same slots, table and lengths)."""
from __future__ import annotations

import random
from types import SimpleNamespace

import pytest
import torch

from radixlang.runtime.kv.kv_manager import KVManager
from radixlang.runtime.kv.memory import KVPool, ReqToToken, SlotAllocator
from radixlang.runtime.kv.radix_cache import RadixCache


@pytest.mark.parametrize("n", [1, 2, 32, 33, 60])  # FEW_WRITES = 32: a write per run up to 32, one scatter beyond
def test_write_runs_matches_one_write_per_run(n):
    rng = random.Random(n)
    batched, one_by_one = ReqToToken(64, 48, torch.device("cpu")), ReqToToken(64, 48, torch.device("cpu"))
    for _ in range(4):
        rows = rng.sample(range(64), n)
        lens = [rng.randint(1, 12) for _ in rows]
        starts = [rng.randint(0, 48 - k) for k in lens]
        slots = torch.randperm(10_000)[:sum(lens)]
        batched.write_runs(rows, starts, lens, slots)
        at = 0
        for row, start, k in zip(rows, starts, lens):
            one_by_one.write(row, start, slots[at:at + k])
            at += k
        assert torch.equal(batched.table, one_by_one.table)


def kv_manager() -> KVManager:
    allocator = SlotAllocator(256, torch.device("cpu"))
    pool = KVPool(256, 1, 1, 2, torch.float32, torch.device("cpu"))
    return KVManager(pool, allocator, ReqToToken(16, 64, torch.device("cpu")), RadixCache(allocator.free))


def test_extend_all_matches_extending_each_request_in_turn():
    rng = random.Random(0)
    sides = [kv_manager(), kv_manager()]
    reqs = [[SimpleNamespace(row=None, kv_len=0, slot_len=0) for _ in range(10)] for _ in sides]
    for side, rs in zip(sides, reqs):
        side.allocator.alloc(7)  # some slots already taken: the free list does not start at 0
        for r in rs:
            r.row = side.req_to_token.alloc_row()
    for _ in range(3):
        counts = [rng.choice([1, 1, rng.randint(2, 6)]) for _ in range(10)]
        starts = sides[0].extend_all(list(zip(reqs[0], counts)))
        assert starts == [sides[1].extend(r, n) for r, n in zip(reqs[1], counts)]
        for a, b in zip(*reqs):
            assert (a.row, a.slot_len) == (b.row, b.slot_len)
            a.kv_len = b.kv_len = a.slot_len  # the step ran
        assert torch.equal(sides[0].req_to_token.table, sides[1].req_to_token.table)
        assert torch.equal(sides[0].allocator.free_slots(), sides[1].allocator.free_slots())


def test_allocator_hands_out_slots_in_the_order_of_a_list_that_frees_append_to():
    """Queued frees against the definition: one free list, frees appended at its end, allocations from its
    front (the order decides which slots a request gets, so outputs stay the same)."""
    rng = random.Random(1)
    allocator, reference = SlotAllocator(50, torch.device("cpu")), list(range(50))
    held: list[int] = []
    for _ in range(300):
        if held and rng.random() < 0.5:
            k = rng.randint(1, len(held))
            freed, held = held[:k], held[k:]
            rng.shuffle(freed)
            allocator.free(torch.tensor(freed, dtype=torch.int64))
            reference += freed
        else:
            n = rng.randint(0, 12)
            got = allocator.alloc(n)
            if n > len(reference):
                assert got is None
                continue
            assert got.tolist() == reference[:n]
            held += reference[:n]
            reference = reference[n:]
        assert allocator.num_free == len(reference)
        if rng.random() < 0.1:
            assert allocator.free_slots().tolist() == reference
