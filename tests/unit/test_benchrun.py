"""One benchmark at a time on a machine, and each run's load and CPU beside its wall time."""
from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import pytest

from shared.benchrun import BenchBusy, Conditions, bench_run, judge

pytestmark = pytest.mark.unit


def test_a_second_benchmark_is_refused_naming_who_holds_the_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("DUALPATH_BENCH_LOCK", str(tmp_path / "bench.lock"))
    holder = textwrap.dedent("""
        import sys, time
        from shared.benchrun import bench_run
        with bench_run("the holder", say=lambda line: None):
            print("held", flush=True)
            sys.stdin.readline()
    """)
    p = subprocess.Popen([sys.executable, "-c", holder], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                         env={**__import__("os").environ})
    try:
        assert p.stdout.readline().strip() == "held"
        with pytest.raises(BenchBusy) as e:
            with bench_run("the second", say=lambda line: None):
                pass
        assert e.value.holder["pid"] == p.pid and e.value.holder["name"] == "the holder"
        assert f"pid {p.pid} (the holder" in str(e.value)
    finally:
        p.communicate("\n")
    with bench_run("after it", say=lambda line: None) as cond:  # released when the holder ended
        sum(range(10_000))
    assert cond.wall_s > 0 and cond.cpu_s >= 0 and len(cond.load_start) == 3
    assert json.loads(json.dumps(cond.report()))["name"] == "after it"


@pytest.mark.parametrize("start,others,flagged", [(0.4, 0.2, ""), (1.6, 0.0, "at the start"),
                                                  (0.4, 1.7, "beyond this run's own work")])
def test_a_run_on_a_busy_machine_is_flagged(start, others, flagged):
    c = Conditions("x", load_start=[start, 0, 0], load_end=[start + others, 0, 0], others_load=others)
    why = judge(c)
    assert (flagged in why) if flagged else why == ""
    c.flagged = why
    assert ("NOT QUIET" in c.line()) == bool(flagged)


def test_the_cpu_counts_descendants_still_running():
    """A mesh the run started is still up when its report is written: its CPU counts all the same."""
    from shared import benchrun

    child = subprocess.Popen([sys.executable, "-c", "import time\nt=time.process_time()\n"
                              "while time.process_time() - t < 0.3: pass\nprint('burnt', flush=True)\ntime.sleep(60)"],
                             stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout.readline().strip() == "burnt"
        assert benchrun._running_descendants_cpu() >= 0.3
    finally:
        child.kill()
        child.wait()
        child.stdout.close()
