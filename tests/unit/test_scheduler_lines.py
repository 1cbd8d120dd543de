"""The scheduler's engine lines kept between rounds (`placement.Lines`) read exactly what
`engine_loads` builds afresh, through placements, first tokens, finishes, read queues moving
and engines joining or going silent; and heartbeats that change nothing rebuild nothing."""
from __future__ import annotations

import random

import pytest

from services.scheduler.placement import Lines, engine_loads
from services.scheduler.view import MeshView
from shared.messages.registry import EngineAnnounce, KVRegion, TrafficManagerAnnounce
from shared.sched.dispatch import Dispatcher, Job
from shared.sched.reads import PathDecision, PendingReads

pytestmark = pytest.mark.unit


def announce(view: MeshView, eid: str, role: str, node: str, at: float, blocks: int = 256) -> None:
    view.update(EngineAnnounce(f"i-{eid}", node, engine=eid, role=role, group=node, total_blocks=blocks,
                               kv=KVRegion("shm-x", 16, 8, 2, 1024, 512)), at)
    view.update(TrafficManagerAnnounce(f"tm-{eid}", node, engine=eid, ready=True), at)


def rows(lines) -> list[tuple]:
    return [(e.engine, e.tok, e.seq, e.capacity_tokens, e.group, e.node, e.read_q) for e in lines]


def fresh(view, d, reads, now):
    return rows(engine_loads(view, d.ledger, reads, "prefill", now)), rows(engine_loads(view, d.ledger, reads,
                                                                                           "decode", now))


def test_kept_lines_read_as_fresh_ones_through_a_random_run():
    rng = random.Random(7)
    view, d, reads, lines = MeshView(timeout_s=3.0), Dispatcher(), PendingReads(), Lines()
    engines = [(f"p{i}", "prefill", f"np{i // 2}") for i in range(4)] + [(f"d{i}", "decode", f"nd{i // 2}")
                                                                         for i in range(4)]
    now = 0.0
    for eid, role, node in engines:
        announce(view, eid, role, node, now)
    placed: list[tuple[str, str, str]] = []
    n = assigned = 0
    for step in range(400):
        now += 0.1
        for eid, role, node in engines:
            if eid != "d3" or step < 150 or step > 250:  # d3 goes silent for a while, then comes back
                announce(view, eid, role, node, now)
        op = rng.random()
        if op < 0.4:
            n += 1
            d.enqueue(Job(f"r{n}", rng.randrange(1, 200), rng.randrange(1, 50)))
        elif op < 0.6 and placed:
            rid, pe, de = placed.pop(rng.randrange(len(placed)))
            d.prefill_done(rid)
            reads.read_done(rid, view.node_of(pe))
            if rng.random() < 0.5:
                d.remove(rid)
                reads.done(rid)
        pes, des = lines.get(view, d.ledger, reads, now)
        assert (rows(pes), rows(des)) == fresh(view, d, reads, now), step
        got = d.assign(pes, des)
        assigned += len(got)
        assert (rows(pes), rows(des)) == fresh(view, d, reads, now), step  # placed in place, as the ledger says
        for a in got:  # then their reads held (the next round's lines read the new queues)
            pe_node, de_node = view.node_of(a.pe), view.node_of(a.de)
            reads.hold(a.req_id, PathDecision(rng.randrange(3), rng.randrange(3), 0, 0, ""), pe_node, de_node, 16)
            placed.append((a.req_id, a.pe, a.de))
    assert assigned > 50 and lines.rebuilds >= 3  # the start, d3 gone, d3 back (and expiry rescans keep the lines)


def test_heartbeats_that_change_nothing_keep_the_lines():
    view, d, reads, lines = MeshView(timeout_s=3.0), Dispatcher(), PendingReads(), Lines()
    for t in range(50):  # ten seconds of heartbeats: past many expiry rescans
        for eid, role in (("p0", "prefill"), ("d0", "decode")):
            announce(view, eid, role, "n0", t * 0.2)
        pes, des = lines.get(view, d.ledger, reads, t * 0.2)
    assert lines.rebuilds == 1 and [e.engine for e in pes + des] == ["p0", "d0"]
    announce(view, "d0", "decode", "n0", 10.0, blocks=512)  # a KV size change is a change
    _, des = lines.get(view, d.ledger, reads, 10.0)
    assert lines.rebuilds == 2 and des[0].capacity_tokens == 512 * 8


def test_decode_totals_kept_from_the_lines_changes_decide_as_a_recount():
    """The service tells the dispatcher which lines a round refreshed (`Lines.changed`); a twin
    that recounts every pull makes the same assignments, and the kept group totals equal a recount."""
    rng = random.Random(11)
    view = MeshView(timeout_s=3.0)
    engines = [(f"p{i}", "prefill", f"np{i // 2}") for i in range(4)] + [(f"d{i}", "decode", f"nd{i // 2}")
                                                                         for i in range(8)]
    worlds = [(Dispatcher(), PendingReads(), Lines()) for _ in range(2)]  # told / recounting
    now, n, placed, assigned, kept_pulls = 0.0, 0, [], 0, 0
    for step in range(500):
        now += 0.1
        for eid, role, node in engines:
            if eid != "d5" or step < 200 or step > 260:
                announce(view, eid, role, node, now, blocks=48)  # small decode memory: capacity decides
        op = rng.random()
        if op < 0.45:
            n += 1
            job = Job(f"r{n}", rng.randrange(1, 120), rng.randrange(1, 40))
            for d, _, _ in worlds:
                d.enqueue(job)
        elif op < 0.7 and placed:
            rid, pe = placed.pop(rng.randrange(len(placed)))
            done = rng.random() < 0.6
            for d, reads, _ in worlds:
                d.prefill_done(rid)
                reads.read_done(rid, view.node_of(pe))
                if done:
                    d.remove(rid)
                    reads.done(rid)
        got = []
        for i, (d, reads, lines) in enumerate(worlds):
            pes, des = lines.get(view, d.ledger, reads, now)
            kept_pulls += i == 0 and lines.changed is not None
            got.append(d.assign(pes, des, lines.changed if i == 0 else None))
            roster = d._roster("decode", des)
            assert roster.tot == [sum(e.tok for e in g) for g in roster.groups], step
        assert got[0] == got[1], step
        for a in got[0]:
            for _, reads, _ in worlds:
                reads.hold(a.req_id, PathDecision(1, 0, 0, 0, ""), view.node_of(a.pe), view.node_of(a.de), 16)
            placed.append((a.req_id, a.pe))
        assigned += len(got[0])
    assert assigned > 50 and kept_pulls > 300, (assigned, kept_pulls)
