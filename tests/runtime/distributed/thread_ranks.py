"""Tensor-parallel ranks as threads of the test process, over an in-process gloo group: the sharded model's
math without worker processes."""
from __future__ import annotations

import datetime
import threading
from typing import Callable, TypeVar

import torch.distributed as dist

from radixlang.runtime.distributed.group import TensorParallel

T = TypeVar("T")


def run_ranks(size: int, body: Callable[[TensorParallel], T], timeout_s: float = 120) -> dict[int, T]:
    """rank -> body(that rank's TensorParallel), every rank in its own thread; a rank's exception is raised here."""
    store, results, errors = dist.HashStore(), {}, []

    def rank(r: int) -> None:
        try:
            opts = dist.ProcessGroupGloo._Options()
            opts._timeout = datetime.timedelta(seconds=timeout_s / 2)
            opts._devices = [dist.ProcessGroupGloo.create_device(hostname="127.0.0.1")]
            results[r] = body(TensorParallel(r, size, dist.ProcessGroupGloo(store, r, size, opts)))
        except Exception as e:  # noqa: BLE001 - re-raised below
            errors.append(e)

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(size)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout_s)
    if errors:
        raise errors[0]
    assert len(results) == size, "a rank did not finish"
    return results
