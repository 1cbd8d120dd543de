"""A short soak with every kind of process fault injected: no request is lost or hangs."""
from __future__ import annotations

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.slow]


def test_short_soak_with_faults_loses_no_request():
    from dualpath.bench.soak import FAULTS, run

    res = run(minutes=0.6, agents=3, fault_every=7.0, warmup=4.0, min_faults=len(FAULTS))
    assert res["completed"] > 0
    assert res["lost"] == 0, res
    assert {row["fault"].split("-")[0] for row in res["faults"]} >= {f.split("-")[0] for f in FAULTS}
    for row in res["faults"]:  # recovery time is the soak's figure; 60 s only tells a mesh that never recovered
        assert row["lost"] == 0 and row["recovery_s"] < 60, row
    assert res["requests"] == res["completed"] + res["failed_cleanly"] + res["lost"]
    assert res["leaks"] == [], "KV blocks or buffer slots not freed after the faults"
    assert res["torn_blocks"] == [], "a stored block does not verify"
