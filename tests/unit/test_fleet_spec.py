"""The fleet bench's spec: `--core-cpu` names a CPU this process may use, with one left over."""
from __future__ import annotations

import os

import pytest

from dualpath.fleet.driver import FleetSpec
from dualpath.fleet.procs import children, set_affinity


def test_a_core_cpu_outside_this_process_is_refused_by_name():
    bad = max(os.sched_getaffinity(0)) + 64
    with pytest.raises(ValueError, match=f"core_cpu {bad}"):
        FleetSpec(engines=24, core_cpu=bad).check()


def test_no_pinning_by_default_and_a_cpu_of_our_own_is_taken():
    FleetSpec(engines=24).check()
    mine = os.sched_getaffinity(0)
    if len(mine) < 2:
        with pytest.raises(ValueError, match="at least one left"):
            FleetSpec(engines=24, core_cpu=min(mine)).check()
    else:
        FleetSpec(engines=24, core_cpu=min(mine)).check()


def test_set_affinity_moves_every_thread_of_a_process():
    import subprocess
    import sys

    mine = os.sched_getaffinity(0)
    one = {min(mine)}
    # a child with a second thread: both threads must land on `one`
    child = subprocess.Popen([sys.executable, "-c",
                              "import threading, sys; threading.Thread(target=sys.stdin.read).start(); "
                              "print('up', flush=True); sys.stdin.read()"],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "up"
        assert child.pid in children(os.getpid())
        set_affinity(child.pid, one)
        tids = os.listdir(f"/proc/{child.pid}/task")
        assert len(tids) >= 2
        assert all(os.sched_getaffinity(int(t)) == one for t in tids)
    finally:
        child.stdin.close()
        child.wait()
        child.stdout.close()
    set_affinity(-1, one)  # a process that is not there: nothing happens, nothing raises
