"""How torch's OpenMP workers wait, chosen from the machine's state before torch loads (issue 43: contention).

libgomp's workers spin after each parallel region (GOMP_SPINCOUNT, 300,000 turns by default) so the next region
starts without waking them: on an idle machine that is the decode loop's speed. On a machine whose cores are
already busy with other processes, the spinning steals the cores the other workers need, and a region's barrier
waits for a worker that the kernel has descheduled: the default model's quickstart took 42-81 s there against
4 s with OMP_WAIT_POLICY=passive (workers sleep at once).

So, as radixlang's runtime is first imported (before torch, which reads these variables once, as libgomp loads):
- the usable CPUs are the affinity mask's, capped by a cgroup's CPU quota (a container's `--cpus`);
- the machine counts as busy when its load (other processes: this one has not started work yet) reaches half the
  usable CPUs, or the quota is below the affinity mask. The load is the larger of the 1-minute load average and the
  tasks runnable right now (the least of a few samples of /proc/loadavg's count, less this process): the average
  rises slowly, so a competitor started seconds before (benchmark/contention.py's busy loops, a build just begun)
  was not in it yet and the workers spun beside it; the samples' least leaves out a moment's spike;
- busy: OMP_WAIT_POLICY=passive; and where a quota caps the CPUs, OMP_NUM_THREADS = the quota (torch would start a
  thread per CPU of the mask, more than the quota lets run);
- idle: nothing changes (spinning workers, torch's thread count).
A variable the user set (OMP_WAIT_POLICY, GOMP_SPINCOUNT, OMP_NUM_THREADS) is left as it is, and
RADIXLANG_OPENMP_POLICY=off turns the choice off. Where torch was imported before radixlang's runtime, libgomp has
read its settings already and nothing is changed. The choice is made once: a competitor that starts later is not
seen (measured in benchmark/contention.py; docs/performance.md)."""
from __future__ import annotations

import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

BUSY_LOAD_PER_CPU = 0.5  # the load per usable CPU from which the machine counts as busy
RUNNABLE_SAMPLES = 3  # samples of the runnable count, RUNNABLE_SAMPLE_GAP_S apart (~10 ms at import)
RUNNABLE_SAMPLE_GAP_S = 0.005
USER_VARIABLES = ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")


@dataclass(frozen=True, slots=True)
class Policy:
    """What `choose` decided and why; `env` holds the variables it sets."""

    env: dict[str, str]
    reason: str


def usable_cpus(affinity: int, quota: float | None) -> float:
    return min(float(affinity), quota) if quota is not None else float(affinity)


def cgroup_quota(root: Path = Path("/sys/fs/cgroup")) -> float | None:
    """CPUs a cgroup v2 quota allows (cpu.max: "quota period", or "max"), or None where none is set."""
    try:
        quota, period = (root / "cpu.max").read_text().split()[:2]
    except (OSError, ValueError):
        return None
    return None if quota == "max" else int(quota) / int(period)


def runnable_others(loadavg: Path = Path("/proc/loadavg"), samples: int = RUNNABLE_SAMPLES,
                    gap_s: float = RUNNABLE_SAMPLE_GAP_S) -> int:
    """Tasks of other processes runnable now: the least over `samples` reads of /proc/loadavg's "running/total"
    field, less this process's reading thread (0 where the file cannot be read)."""
    least: int | None = None
    for i in range(samples):
        if i:
            time.sleep(gap_s)
        try:
            running = int(loadavg.read_text().split()[3].split("/")[0])
        except (OSError, IndexError, ValueError):
            return 0
        least = running if least is None else min(least, running)
    return max(0, (least or 0) - 1)


def choose(affinity: int, quota: float | None, load: float, environ: dict[str, str] | os._Environ[str]) -> Policy:
    """The OpenMP settings for a machine with `affinity` CPUs, a cgroup `quota` (CPUs, or None), and a 1-minute
    `load` average, where `environ` is the process's environment."""
    if environ.get("RADIXLANG_OPENMP_POLICY", "auto") == "off":
        return Policy({}, "RADIXLANG_OPENMP_POLICY=off")
    if any(v in environ for v in USER_VARIABLES):
        return Policy({}, "the user set the wait policy")
    cpus = usable_cpus(affinity, quota)
    capped = quota is not None and quota < affinity
    if load < BUSY_LOAD_PER_CPU * cpus and not capped:
        return Policy({}, f"idle: load {load:.2f} on {cpus:g} CPUs")
    env = {"OMP_WAIT_POLICY": "passive"}
    if capped and "OMP_NUM_THREADS" not in environ:
        env["OMP_NUM_THREADS"] = str(max(1, math.floor(cpus)))
    return Policy(env, f"busy: load {load:.2f} on {cpus:g} usable CPUs" + (" (a cgroup quota)" if capped else ""))


def apply() -> Policy | None:
    """Sets the chosen variables in this process's environment, before torch loads; None where torch (and so
    libgomp) is loaded already."""
    if "torch" in sys.modules:
        return None
    try:
        affinity = len(os.sched_getaffinity(0))
        load = max(os.getloadavg()[0], float(runnable_others()))
    except (AttributeError, OSError):  # not Linux
        return None
    policy = choose(affinity, cgroup_quota(), load, os.environ)
    os.environ.update(policy.env)
    return policy
