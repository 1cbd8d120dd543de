"""One workload, two drivers: the simulator's pulls and the scheduler service's dispatch code
make the same assignments and the same read-path decisions.

The simulator runs a small workload; every event its dispatcher hears (a request arriving,
a pull by one prefill group, a first token, a request's end, a read-path decision, a
node's reads done) is recorded. The same events are then replayed through the service's side: a `MeshView` built
from engine announcements, `placement.engine_loads`, the `Dispatcher`, `ReadQueues`.
Both must choose the same engine pair for every request, in the same pulls, and split its
reads the same way.
"""
from __future__ import annotations

from dataclasses import replace

import pytest

from dualpath.sim.config import SimConfig
from dualpath.sim.engine import Simulation
from services.scheduler.placement import engine_loads
from services.scheduler.view import MeshView
from shared.messages.registry import EngineAnnounce, KVRegion, TrafficManagerAnnounce
from shared.sched.dispatch import Dispatcher, Job
from shared.sched.reads import PendingReads

pytestmark = pytest.mark.unit

# 4 prefill + 4 decode nodes of 8 engines, two nodes a group; storage NICs slowed (SLOW) and short alpha and
# beta, so read queues and token caps steer Algorithm 1 (classes 1, 2 and 3 all occur)
CFG = SimConfig(model="ds-27b", P=4, D=4, group_nodes=2, trace="gen:32k:12", agents=48, scale=0.15, alpha_s=0.002,
                beta_s=0.003, mode="dualpath-split")
SLOW = 50


def eng(eid: int) -> str:
    return f"e{eid:04d}"  # zero-padded: the service's string order is the simulator's int order


def node(nid: int) -> str:
    return f"n{nid:03d}"


def record(sim: Simulation) -> list[tuple]:
    """Wrap the simulator's dispatcher so every event it hears lands in the returned log."""
    log: list[tuple] = []
    s, d, reads = sim.sched, sim.sched.d, sim.sched.reads

    def wrap(obj, name, entry):
        inner = getattr(obj, name)

        def call(*args, **kw):
            out = inner(*args, **kw)
            log.append(entry(out, *args, **kw))
            return out
        setattr(obj, name, call)

    wrap(s, "submit", lambda out, r: ("submit", r.rid, r.prompt, r.gen))
    wrap(d, "pull_prefill", lambda out, pes: ("pe pull", [e.engine for e in pes]))
    wrap(d, "pull_decode", lambda out, des, changed=None: ("pull", [(a.req_id, a.pe, a.de) for a in out]))
    wrap(s, "prefill_done", lambda out, r: ("first", r.rid))
    wrap(s, "finished", lambda out, r: ("end", r.rid))
    wrap(reads, "decide", lambda out, mode, blocks, pe, de, bs, force="auto":
         ("decide", mode, blocks, pe, de, bs, force, (out.pe_blocks, out.de_blocks, out.reason)))
    wrap(reads, "hold", lambda out, rid, dec, pe, de, bs: ("hold", rid, pe, de, bs))
    wrap(reads, "read_done", lambda out, rid, n: ("read", rid, n))
    return log


def service_view(sim: Simulation) -> MeshView:
    """The simulated cluster as the scheduler would hear it announced."""
    view = MeshView(timeout_s=float("inf"))
    for e in sim.c.engines:
        role = "prefill" if e.node.role == "p" else "decode"
        kv = KVRegion("sim", e.cap, 1, 1, 1, 1)  # one-token blocks: capacity in tokens, as the simulator counts
        view.update(EngineAnnounce(f"i{e.eid}", node(e.node.nid), engine=eng(e.eid), role=role,
                                   group=f"g{e.group.gid:03d}", kv=kv, total_blocks=e.cap), 0.0)
        view.update(TrafficManagerAnnounce(f"t{e.eid}", node(e.node.nid), engine=eng(e.eid), ready=True), 0.0)
    return view


def replay(sim: Simulation, log: list[tuple]) -> tuple[list, list]:
    """The recorded events through the service's code; (pulls, read decisions) it makes."""
    view, d, reads = service_view(sim), Dispatcher(sim.th), PendingReads()
    pulls, decisions = [], []
    for ev in log:
        kind, rest = ev[0], ev[1:]
        if kind == "submit":
            rid, prompt, gen = rest
            d.enqueue(Job(f"r{rid}", prompt, gen))
        elif kind == "pe pull":  # one prefill group pulls (its engines)
            group = {eng(e) for e in rest[0]}
            d.pull_prefill([line for line in engine_loads(view, d.ledger, reads, "prefill", 0.0) if line.engine in group])
        elif kind == "pull":  # the decode groups pull: requests get both engines
            des = engine_loads(view, d.ledger, reads, "decode", 0.0)
            pulls.append([(a.req_id, a.pe, a.de) for a in d.pull_decode(des)])
        elif kind == "first":
            d.prefill_done(f"r{rest[0]}")
        elif kind == "end":
            d.remove(f"r{rest[0]}")
        elif kind == "decide":
            mode, blocks, pe, de, bs, force, _ = rest
            last = reads.decide(mode, blocks, node(pe), node(de), bs, force=force)
            decisions.append((last.pe_blocks, last.de_blocks, last.reason))
        elif kind == "hold":  # always right after its decision, as in the service's `place`
            rid, pe, de, bs = rest
            reads.hold(f"r{rid}", last, node(pe), node(de), bs)
        elif kind == "read":
            reads.read_done(f"r{rest[0]}", node(rest[1]))
    return pulls, decisions


def as_service(pulls: list) -> list:
    return [[(f"r{rid}", eng(pe), eng(de)) for rid, pe, de in p] for p in pulls]


def simulation(cfg: SimConfig) -> Simulation:
    sim = Simulation(cfg)
    for n in sim.c.nodes:
        n.snic_r.bw /= SLOW
    return sim


@pytest.fixture(scope="module")
def runs():
    sim = simulation(CFG)
    log = record(sim)
    pressure = []  # per pull: nodes whose read queue exceeds alpha; prefill engines over beta
    inner = sim.sched.d.pull_prefill

    def pull(pes):
        pressure.append((sum(1 for e in pes if e.read_q > sim.th.alpha), sum(1 for e in pes if e.tok > sim.th.beta)))
        return inner(pes)
    sim.sched.d.pull_prefill = pull
    result = sim.run()
    return sim, log, result, pressure


def test_the_run_exercises_the_dispatcher(runs):
    sim, log, result, pressure = runs
    pulls = [ev[1] for ev in log if ev[0] == "pull"]
    assert result.requests == sim.w.total_requests
    assert sum(map(len, pulls)) == result.requests  # every request placed once, by a recorded pull
    assert sum(1 for p in pulls if len(p) > 1) > 5  # pulls that place several requests: order matters
    assert len({pe for p in pulls for _, pe, _ in p}) > 8  # spread over many prefill engines
    splits = [ev for ev in log if ev[0] == "decide" and ev[7][0] and ev[7][1]]
    assert splits  # some reads split across both paths
    assert sum(1 for q, _ in pressure if q) > len(pressure) // 4  # disk-pressured engines (class 3) are common
    assert any(b for _, b in pressure)  # and overloaded ones (class 1) occur


def test_service_dispatch_code_makes_the_simulators_assignments(runs):
    sim, log, *_ = runs
    pulls, _ = replay(sim, log)
    want = as_service([ev[1] for ev in log if ev[0] == "pull"])
    assert len(pulls) == len(want)
    for i, (got, exp) in enumerate(zip(pulls, want)):
        assert got == exp, f"pull {i} differs"


def test_service_read_queues_make_the_simulators_read_decisions(runs):
    sim, log, *_ = runs
    _, decisions = replay(sim, log)
    assert decisions == [ev[7] for ev in log if ev[0] == "decide"]


def test_the_block_size_is_the_runs_not_a_constant():
    sim = simulation(replace(CFG, block_tokens=32, agents=8))
    log = record(sim)
    sim.run()
    sizes = {ev[5] for ev in log if ev[0] == "decide"}
    assert sizes == {32}
