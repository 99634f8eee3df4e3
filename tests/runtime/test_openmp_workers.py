"""A thread that stops running torch gives its OpenMP workers back (runtime/openmp_workers.py): counted as the
OS's threads of a fresh process, not timed."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

SCRIPT = r"""
import json, os, sys, time
import torch
from radixlang.runtime import openmp_workers
from radixlang.runtime.engine import Engine
from radixlang.runtime.scheduler_thread import SchedulerThread

if openmp_workers._libgomp_pause() is None:
    print(json.dumps({"skip": "torch does not run on a libgomp with omp_pause_resource_all here"}))
    sys.exit(0)
torch.set_num_threads(2)


def os_threads() -> int:
    return len(os.listdir("/proc/self/task"))


def settled(expected: int) -> int:
    # a released worker leaves its pool at once but its thread exits a moment later
    deadline = time.monotonic() + 5
    while os_threads() != expected and time.monotonic() < deadline:
        time.sleep(0.01)
    return os_threads()


def parallel_op() -> None:  # far above at::parallel_for's grain: both threads run it
    torch.ones(1 << 22).add_(1)


out = {}
base = os_threads()
parallel_op()
out["main pool"] = os_threads() - base
openmp_workers.release_openmp_workers()
out["main released"] = settled(base) - base


class OneParallelStep:  # a scheduler core whose one step runs torch on both threads
    def __init__(self):
        self.has_work = True

    def step(self):
        parallel_op()
        self.has_work = False
        return True

    def abort_all(self, error=None):
        pass


loop = SchedulerThread(OneParallelStep())  # the loop steps at once: has_work starts True
out["scheduler idle"] = settled(base + 1) - base  # its own thread stays; its worker goes
loop.stop()
settled(base)

engine = Engine(sys.argv[1], device="cpu", kv_cache_tokens=1024, compile_layers=False)
params = {"max_new_tokens": 2, "temperature": 0}
engine.generate("warm up", params)
time.sleep(0.3)
engine_base = os_threads()
parallel_op()
out["caller pool"] = os_threads() - engine_base
engine.generate("hello", params)  # the submitting thread waits on the engine: its worker goes
out["caller released"] = settled(engine_base) - engine_base
engine.check_invariants()  # no KV slot leaked
engine.shutdown()
print(json.dumps(out))
"""


def test_idle_threads_release_their_openmp_workers(tiny_model_dir):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_dir)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr[-3000:]
    counts = json.loads(proc.stdout.strip().splitlines()[-1])
    if "skip" in counts:
        pytest.skip(counts["skip"])
    assert counts == {"main pool": 1, "main released": 0, "scheduler idle": 1, "caller pool": 1,
                      "caller released": 0}, counts
