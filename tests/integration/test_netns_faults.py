"""Network faults under closed-loop load across namespaces: a cut link and a NATS partition.

A 2P2D tiny mesh, every node on its own tc-shaped link (root; skipped with the reason
otherwise). A prefill node's link is cut for 10 s, later the NATS host is partitioned for
5 s; no request is lost, every completed stream that ran during a fault carries exactly
the reference's tokens (none twice, none stale), and the mesh serves every engine again.
The bench (`python -m dualpath.bench.netfaults`) prints the same table for all four faults.
"""
from __future__ import annotations

import pytest

from dualpath.netns.fabric import probe

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.timeout(900),
              pytest.mark.skipif(probe() is not None, reason=f"network namespaces: {probe()}")]


def test_a_cut_link_and_a_nats_partition_lose_no_request_and_repeat_no_token():
    from dualpath.bench.netfaults import run

    res = run(["cut", "partition"], agents_n=2, calm=3.0)
    rows = {r["fault"]: r for r in res["faults"]}
    assert set(rows) == {"cut", "partition"}
    for r in rows.values():
        assert r["requests"] > 0 and r["lost"] == 0, r
        assert r["duplicated_tokens"] == 0, r
        assert r["requests"] == r["completed"] + r["failed_cleanly"], r
        assert r["recovery_s"] < 120, r  # a hang guard: the figure itself is the bench's
    assert res["lost"] == 0 and res["completed"] > 0
