"""The scheduler micro-bench: its rounds are the scheduler's, and its flags are checked."""
from __future__ import annotations

import pytest

from dualpath.bench import sched

pytestmark = pytest.mark.unit


def test_mesh_keeps_its_requests_placed_and_loads_agree_with_the_recount():
    m = sched.DispatchMesh(engines=16, inflight=300, arrivals=8, recount=False)
    for _ in range(5):
        m.churn()
        m.round()
    assert len(m.order) >= 300 - 8 and m.d.waiting() == 0  # every arrival placed in its round
    m.d.ledger.check_integrity()
    for role in ("prefill", "decode"):  # the former way, from the same state: the same figures
        m.recount = False
        fast = [(e.engine, e.tok, e.seq) for e in m.loads(role)]
        m.recount = True
        assert [(e.engine, e.tok, e.seq) for e in m.loads(role)] == fast


def test_prints_a_row_per_cluster_size(capsys):
    assert sched.main(["--engines", "4", "8", "--inflight", "64", "--seconds", "0.01", "--no-recount"]) == 0
    rows = capsys.readouterr().out.splitlines()[2:]
    assert [r.split()[0] for r in rows] == ["4", "8"] and all(float(x) > 0 for r in rows for x in r.split()[1:3])


def test_kept_lines_make_the_same_placements_as_fresh_ones():
    kept, fresh = (sched.DispatchMesh(engines=16, inflight=300, arrivals=8, recount=False, kept=k)
                   for k in (True, False))
    for _ in range(10):
        for m in (kept, fresh):
            m.churn()
            m.round()
        assert kept.last == fresh.last
    assert kept.lines.rebuilds == 1


@pytest.mark.parametrize("flag, value", [("--engines", "1"), ("--inflight", "0"), ("--seconds", "-1")])
def test_bad_flags_are_named(flag, value, capsys):
    with pytest.raises(SystemExit):
        sched.main([flag, value])
    err = capsys.readouterr().err
    assert flag in err and value in err
