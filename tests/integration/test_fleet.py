"""The fleet emulator end to end: a small fleet of emulated engines, a real NATS and the real
scheduler process, with agents over HTTP. Requests are assigned inside the measured window,
every request completes with all the tokens it asked for, and every one reached a prefill
engine (the figures the benchmark prints are made of these), with the scheduler's HTTP side in
a front-door worker process (the engines' tokens go there, not through the dispatch core) and in
the dispatch core's own process. Engine work runs ten times faster
than modelled (`time_scale`), so the last turns end soon after the window."""
from __future__ import annotations

import asyncio
import math
import os

import pytest

from dualpath.fleet.driver import Fleet, FleetSpec

pytestmark = pytest.mark.integration


@pytest.mark.parametrize("workers", [1, 0], ids=["front-door-worker", "in-process-front-door"])
def test_a_small_fleet_assigns_and_completes_every_request(workers):
    spec = FleetSpec(engines=24, groups=2, load=1.0, trace="32k", warmup_s=2.0, measure_s=3.0, time_scale=0.1,
                     idle_s=1.0, front_workers=workers)
    with Fleet(spec) as fleet:
        row = asyncio.run(fleet.run_load())
    assert row["assigned"] > 0 and row["assign_per_s"] > 0, row
    assert row["completed"] > 0 and row["failed"] == 0, row["errors"]
    assert row["short"] == 0 and row["never_assigned"] == 0, row
    assert row["tokens"] > 0  # the emulated decode engines generated them
    assert math.isfinite(row["assign_p99_ms"]) and row["sched_cores"] > 0 and math.isfinite(row["sched_idle_cores"])
    assert row["sched_in_msgs_per_s"] > 0 and row["bus_msgs_per_s"] > row["sched_in_msgs_per_s"]
    if workers:  # the tokens went to the worker, not through the dispatch core
        assert row["front_cores"] > 0 and row["front_in_msgs_per_s"] > 0, row
        assert row["sched_in_msgs_per_s"] < row["front_in_msgs_per_s"], row
    else:
        assert row["front_cores"] == 0 and row["front_in_msgs_per_s"] == 0, row


def test_the_dispatch_core_driven_alone_places_every_synthetic_request():
    """`--core-only`: a synthetic front door's Submits reach the core, each comes back as one
    Forward, and the requests' PrefillOver / Done free their engines (nothing left waiting)."""
    from dualpath.fleet.front import drive_core

    mine = os.sched_getaffinity(0)
    cpu = max(mine) if len(mine) > 1 else -1  # `--core-cpu`: the core on a CPU of its own, where there are two
    spec = FleetSpec(engines=24, groups=1, load=1.0, trace="32k", warmup_s=1.0, measure_s=2.0, time_scale=0.1,
                     idle_s=1.0, front_workers=1, core_cpu=cpu)
    with Fleet(spec) as fleet:
        if cpu >= 0:
            assert os.sched_getaffinity(fleet.procs["scheduler"].pid) == {cpu}
            assert os.sched_getaffinity(fleet.procs["nats"].pid) == mine - {cpu}
            assert os.sched_getaffinity(0) == mine - {cpu}
        row = asyncio.run(drive_core(fleet, 40.0))
    assert os.sched_getaffinity(0) == mine  # the driver's own CPUs back after the run
    assert row["assign_per_s"] > 0 and row["never_assigned"] == 0, row
    assert math.isfinite(row["assign_p99_ms"]) and row["core_cores"] > 0 and row["core_in_msgs_per_s"] > 0, row
