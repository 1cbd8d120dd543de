"""The simulator's side of the shared `Dispatcher`: engine loads in, engine pairs out, on simulated time.

Owns nothing of the policy: each pull is `shared.sched.dispatch.Dispatcher.assign`, the
same code the scheduler service runs, fed the same figures the service feeds it (tok_e
and seq_e from the dispatcher's ledger, free KV from the engine's capacity, read_q from
the shared `ReadQueues`), and each read-path decision is `ReadQueues.decide`. The
simulator tells it what the mesh would: a first token (`prefill_done`), a request's end
(`finished`), a node's reads done (`read_done`). The "rr" variant is the round-robin
baseline: engines in turn, read paths alternating, no live signals.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

from dualpath.sim.cluster import Cluster, Engine, Node
from dualpath.sim.workload import Req
from shared.messages.codes import LoadMode
from shared.sched.dispatch import Dispatcher, EngineLoad, Job
from shared.sched.policy import PeThresholds
from shared.sched.reads import ReadQueues

Assigned = Callable[[Req], None]  # called once a request holds both engines (r.pe, r.de set)


class SimDispatch:
    def __init__(self, cluster: Cluster, th: PeThresholds, mode: LoadMode, assign: str,
                 on_assigned: Assigned, block_tokens: int) -> None:
        self.c = cluster
        self.mode = mode  # dualpath: every hit on the shorter queue; dualpath-split: split (ReadQueues.decide)
        self.rr = assign == "rr"
        self.on_assigned = on_assigned
        self.block = block_tokens
        self.d = Dispatcher(th)
        self.reads = ReadQueues()
        self.reqs: dict[int, Req] = {}  # submitted, not yet given both engines
        self.by_eid = cluster.engines
        self.pe_loads = [_line(e) for e in cluster.pes]  # one line per engine, refreshed at each pull
        self.de_loads = [_line(e) for e in cluster.des]
        self.rr_queue: deque[Req] = deque()
        self.rr_pe = self.rr_de = self.rr_path = 0

    # what the mesh tells the scheduler -------------------------------------------------
    def submit(self, r: Req) -> None:
        if self.rr:
            self.rr_queue.append(r)
            return
        self.reqs[r.rid] = r
        self.d.enqueue(Job(r.rid, r.prompt, r.gen))

    def prefill_done(self, r: Req) -> None:
        self.d.prefill_done(r.rid)

    def finished(self, r: Req) -> None:
        self.d.remove(r.rid)

    def read_done(self, r: Req, node: Node) -> None:
        self.reads.read_done(r.rid, node.nid)

    def pending(self) -> bool:
        return bool(self.rr_queue) if self.rr else self.d.waiting() > 0

    def read_q(self, node: Node) -> int:
        return self.reads.pending.get(node.nid, 0)

    # pulls ------------------------------------------------------------------------------
    def tick(self) -> None:
        """Every group pulls once (the dispatcher rotates which prefill group goes first)."""
        if self.rr:
            self._tick_rr()
            return
        pending = self.reads.pending
        self.d.ledger.fill(self.pe_loads, "prefill")
        self.d.ledger.fill(self.de_loads, "decode")
        for line in self.pe_loads:
            line.read_q = pending.get(line.node, 0)
        for a in self.d.assign(self.pe_loads, self.de_loads):
            r = self.reqs.pop(a.req_id)
            r.pe, r.de = self.by_eid[a.pe], self.by_eid[a.de]
            self.on_assigned(r)

    def _tick_rr(self) -> None:
        pes, des, led = self.c.pes, self.c.des, self.d.ledger
        while self.rr_queue:
            r = self.rr_queue[0]
            for k in range(len(des)):
                e = des[(self.rr_de + k) % len(des)]
                if e.cap - led.de_load(e.eid)[0] >= r.mem:
                    break
            else:
                return  # no decode engine has room: the head waits
            self.rr_queue.popleft()
            self.rr_de += k + 1
            r.pe, r.de = pes[self.rr_pe % len(pes)], e
            self.rr_pe += 1
            led.charge_pe(r.rid, r.pe.eid, r.prompt)
            led.charge_de(r.rid, e.eid, r.mem)
            self.on_assigned(r)

    # read paths -------------------------------------------------------------------------
    def split_hit(self, r: Req) -> tuple[int, int]:
        """(hit tokens on the PE path, on the DE path) once both engines are known; the reads
        are held on the nodes' queues until `read_done`."""
        if r.hit == 0:
            return 0, 0
        force = "auto"  # the mode's own rule
        if self.rr and self.mode.both_paths:
            self.rr_path += 1
            force = "pe" if self.rr_path % 2 else "de"
        blocks = -(-r.hit // self.block)
        pe_node, de_node = r.pe.node.nid, r.de.node.nid
        d = self.reads.decide(self.mode, blocks, pe_node, de_node, self.block, force=force)
        self.reads.hold(r.rid, d, pe_node, de_node, self.block)
        pe_hit = min(r.hit, d.pe_blocks * self.block)
        return pe_hit, r.hit - pe_hit


def _line(e: Engine) -> EngineLoad:
    return EngineLoad(e.eid, capacity_tokens=e.cap, group=e.group.gid, node=e.node.nid)
