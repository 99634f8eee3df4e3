"""Releasing a thread's OpenMP workers once that thread stops running torch, so the thread that runs the model
keeps its cores spinning-ready.

torch's CPU ops run on GNU OpenMP (libgomp), which gives every thread that starts a parallel region a pool
of its own workers, kept after the region ends. Once the process's pools hold more workers than it has CPUs,
libgomp stops letting idle workers spin (its "throttled" spin count, ~1000 turns instead of 300,000), so every
parallel region starts by waking a sleeping worker: tens of µs on a VM, where the idle vCPU has halted. An
engine runs the model on its scheduler thread, and the thread that built the engine (loading, converting
weights) keeps a pool too: two pools of 2 on a 2-CPU machine throttle both. Measured on a 2-core Xeon VM,
SmolLM2-135M `auto`, compiled decode of 16 rows: 69 ms a step with the builder's pool alive, 40 ms with it
released; a 1536 x 576 bf16 mm of 16 rows on a second thread took 288 µs beside the main thread's idle pool,
187 µs once it was released. (Intel's OpenMP spins by time, not by a throttled count, and is left alone.)

So the engine releases the pool of the thread that built it and of each thread that submits to it (that
thread now waits on the engine), and the scheduler thread releases its own when it goes idle (the caller's
torch work, a baseline model in the same process, then runs unthrottled). A released pool is rebuilt by the
thread's next parallel region, one thread start (~50 µs).
"""
from __future__ import annotations

import ctypes
import functools
import os
from typing import Callable

OMP_PAUSE_SOFT = 1  # OpenMP 5.0's omp_pause_soft: the calling thread's workers exit, its settings stay


def release_openmp_workers() -> bool:
    """Ends the calling thread's idle libgomp workers (omp_pause_resource_all); False where torch does not
    run on libgomp, or the thread has none or is inside a parallel region."""
    pause = _libgomp_pause()
    return pause is not None and pause(OMP_PAUSE_SOFT) == 0


@functools.cache
def _libgomp_pause() -> Callable[[int], int] | None:
    path = _loaded_libgomp()
    if path is None:
        return None
    try:
        pause = ctypes.CDLL(path).omp_pause_resource_all  # the loaded library: dlopen returns its handle
    except (OSError, AttributeError):  # a libgomp older than GCC 9 has no pause
        return None
    pause.argtypes, pause.restype = [ctypes.c_int], ctypes.c_int
    return pause


def _loaded_libgomp() -> str | None:
    """The libgomp this process has mapped (torch's own copy in a pip wheel), if any; Linux only."""
    import torch  # noqa: F401 - libgomp is mapped with torch's CPU library

    try:
        with open(f"/proc/{os.getpid()}/maps") as maps:
            for line in maps:
                path = line.rsplit(maxsplit=1)[-1]
                if os.path.basename(path).startswith("libgomp"):
                    return path
    except OSError:
        return None
    return None
