"""runtime/openmp_policy.py: the OpenMP wait policy chosen from the machine's state (issue 43, contention). The
oracle is the rule its docstring states; a fresh interpreter checks the variables are set before torch loads and
that libgomp then runs passive (its own report: OMP_DISPLAY_ENV)."""
from __future__ import annotations

import subprocess
import sys

from radixlang.runtime.openmp_policy import cgroup_quota, choose, runnable_others


def test_an_idle_machine_keeps_spinning_workers():
    assert choose(affinity=2, quota=None, load=0.4, environ={}).env == {}


def test_a_busy_machine_makes_workers_sleep():
    assert choose(affinity=2, quota=None, load=1.0, environ={}).env == {"OMP_WAIT_POLICY": "passive"}
    assert choose(affinity=16, quota=None, load=9.0, environ={}).env == {"OMP_WAIT_POLICY": "passive"}


def test_a_cgroup_quota_caps_the_threads_and_counts_as_busy():
    policy = choose(affinity=8, quota=2.5, load=0.0, environ={})
    assert policy.env == {"OMP_WAIT_POLICY": "passive", "OMP_NUM_THREADS": "2"} and "quota" in policy.reason
    assert choose(affinity=8, quota=2.5, load=0.0, environ={"OMP_NUM_THREADS": "4"}).env == {
        "OMP_WAIT_POLICY": "passive"}
    assert choose(affinity=2, quota=4.0, load=0.0, environ={}).env == {}  # a quota above the mask caps nothing


def test_the_users_settings_win():
    assert choose(2, None, 9.0, {"OMP_WAIT_POLICY": "active"}).env == {}
    assert choose(2, None, 9.0, {"GOMP_SPINCOUNT": "1000"}).env == {}
    assert choose(2, None, 9.0, {"RADIXLANG_OPENMP_POLICY": "off"}).env == {}


def test_cgroup_quota_reads_cpu_max(tmp_path):
    assert cgroup_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("max 100000\n")
    assert cgroup_quota(tmp_path) is None
    (tmp_path / "cpu.max").write_text("150000 100000\n")
    assert cgroup_quota(tmp_path) == 1.5


def test_runnable_tasks_count_the_least_of_the_samples_less_this_process(tmp_path):
    # a competitor started seconds ago is runnable now, long before the 1-minute load average shows it
    loadavg = tmp_path / "loadavg"
    loadavg.write_text("0.12 0.05 0.01 3/178 15518\n")
    assert runnable_others(loadavg, samples=2, gap_s=0) == 2
    assert runnable_others(tmp_path / "missing") == 0
    loadavg.write_text("garbage\n")
    assert runnable_others(loadavg, samples=1) == 0


def test_the_runtime_sets_the_policy_before_torch_loads():
    """A busy machine is forced by a cgroup-free stand-in: the 1-minute load read as 1000."""
    code = ("import os; os.getloadavg = lambda: (1000.0, 0.0, 0.0)\n"
            "import radixlang.runtime as rt, torch\n"
            "torch.set_num_threads(2); torch.ones(64, 64) @ torch.ones(64, 64)\n"
            "print(rt.OPENMP_POLICY.env)")
    env = {"PATH": "/usr/bin:/bin", "OMP_DISPLAY_ENV": "true"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "{'OMP_WAIT_POLICY': 'passive'}" in out.stdout
    assert "OMP_WAIT_POLICY = 'PASSIVE'" in out.stderr  # libgomp's own report of what it read
