"""The dispatcher's kept decode figures (per-group token totals, groups known idle) against a recount.

A caller that names the decode lines it changed (`pull_decode(des, changed)`) lets the
dispatcher keep each group's token total and skip re-reading groups that are still as
they were at a pull that placed nothing. Random traffic drives two dispatchers side by
side, one naming its changes and one not: after every pull the kept totals equal the sums
of the lines, every group marked unchanged equals its snapshot, and both make the same
assignments.
"""
from __future__ import annotations

import random

import pytest

from shared.sched.dispatch import Dispatcher, EngineLoad, Job
from shared.sched.policy import PeThresholds

pytestmark = pytest.mark.unit


def cluster() -> tuple[list[EngineLoad], list[EngineLoad]]:
    pes = [EngineLoad(f"p{i}", group=f"pg{i // 2}", node=f"pn{i // 2}") for i in range(4)]
    des = [EngineLoad(f"d{i}", capacity_tokens=900, group=f"dg{i // 3}", node=f"dn{i // 3}") for i in range(9)]
    return pes, des


def check_kept(d: Dispatcher, des: list[EngineLoad]) -> None:
    roster = d._roster("decode", des)
    assert roster.tot == [sum(e.tok for e in g) for g in roster.groups]
    for g in roster.same:
        key = roster.groups[g][0].group
        if key in d._de_idle:
            assert d._de_idle[key] == tuple((e.engine, e.tok, e.seq, e.capacity_tokens) for e in roster.groups[g])


@pytest.mark.parametrize("seed", range(6))
def test_kept_totals_and_idle_marks_match_a_recount(seed):
    rnd = random.Random(seed)
    th = PeThresholds(alpha=1 << 30, beta=600)
    kept, plain = Dispatcher(th), Dispatcher(th)
    (kpes, kdes), (ppes, pdes) = cluster(), cluster()
    running: list[str] = []
    first: list[str] = []
    changed: set[str] = set()
    placed = pulls = 0
    for step in range(600):
        op = rnd.random()
        if op < 0.3:
            job = Job(f"r{step}", rnd.randint(20, 300), rnd.randint(1, 200))
            kept.enqueue(job)
            plain.enqueue(job)
        elif op < 0.45 and first:
            rid = first.pop(rnd.randrange(len(first)))
            kept.prefill_done(rid)
            plain.prefill_done(rid)
        elif op < 0.65 and running:
            rid = running.pop(rnd.randrange(len(running)))
            if rid in first:
                first.remove(rid)
            charge = kept.ledger.charges.get(rid)
            if charge is not None and charge.de is not None:
                changed.add(charge.de)
            kept.remove(rid)
            plain.remove(rid)
        else:
            for d, pes, des in ((kept, kpes, kdes), (plain, ppes, pdes)):
                d.ledger.fill(pes, "prefill")
                d.ledger.fill(des if d is plain else [e for e in des if e.engine in changed], "decode")
            kept.pull_prefill(kpes)
            got = kept.pull_decode(kdes, sorted(changed))
            want = plain.assign(ppes, pdes)
            changed.clear()
            assert got == want
            check_kept(kept, kdes)
            running += [a.req_id for a in got]
            first += [a.req_id for a in got]
            placed += len(got)
            pulls += 1
    assert placed > 50 and pulls > 50  # the traffic exercised the pulls


def test_a_change_left_unnamed_is_what_the_recount_catches():
    """The check above sees a kept total go wrong: a line changed behind the dispatcher's back."""
    d = Dispatcher()
    _, des = cluster()
    d.enqueue(Job("r0", 100, 10))
    d.pull_prefill([EngineLoad("p0", group="pg0", node="pn0")])
    d.pull_decode(des, [])
    des[0].tok += 5  # not named in `changed`
    d.pull_decode(des, [])
    with pytest.raises(AssertionError):
        check_kept(d, des)
    d.pull_decode(des, [des[0].engine])
    check_kept(d, des)
