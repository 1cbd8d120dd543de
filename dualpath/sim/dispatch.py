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
from shared.sched.dispatch import Dispatcher, EngineLoad, Job
from shared.sched.policy import PeThresholds
from shared.sched.reads import ReadQueues

Assigned = Callable[[Req], None]  # called once a request holds both engines (r.pe, r.de set)


class SimDispatch:
    def __init__(self, cluster: Cluster, th: PeThresholds, mode: str, assign: str, split: bool,
                 on_assigned: Assigned, block_tokens: int) -> None:
        self.c = cluster
        self.mode = mode
        self.rr = assign == "rr"
        self.force = "auto" if split else "choose"  # split each request's hits, or all on the shorter queue
        self.on_assigned = on_assigned
        self.block = block_tokens
        self.d = Dispatcher(th)
        self.reads = ReadQueues()
        self.reqs: dict[int, Req] = {}  # submitted, not yet given both engines
        self.by_eid = cluster.engines
        self.pe_loads = [_line(e) for e in cluster.pes]  # one line per engine, kept current (below)
        self.de_loads = [_line(e) for e in cluster.des]
        # The dispatcher updates the lines of what it places itself; what changes its ledger or
        # the read queues outside a pull is noted here and copied into the lines at the next pull
        # (the same figures as a full refresh, for the engines and nodes that changed only).
        self.pe_line = {e.eid: line for e, line in zip(cluster.pes, self.pe_loads)}
        self.de_line = {e.eid: line for e, line in zip(cluster.des, self.de_loads)}
        self.lines_of_node: dict[int, list[EngineLoad]] = {}
        for line in self.pe_loads:
            self.lines_of_node.setdefault(line.node, []).append(line)
        self.touched_pe: set[int] = set()
        self.touched_de: set[int] = set()
        self.touched_nodes: set[int] = set()
        self.rr_queue: deque[Req] = deque()
        self.rr_pe = self.rr_de = self.rr_path = 0
        # something a pull reads changed since the last pull (a pull leaves a fixed point: pulling
        # again on unchanged loads places nothing, so such pulls are skipped, not simulated)
        self.dirty = True

    # what the mesh tells the scheduler -------------------------------------------------
    def submit(self, r: Req) -> None:
        self.dirty = True
        if self.rr:
            self.rr_queue.append(r)
            return
        self.reqs[r.rid] = r
        self.d.enqueue(Job(r.rid, r.prompt, r.gen))

    def prefill_done(self, r: Req) -> None:
        self.dirty = True
        self.touched_pe.add(r.pe.eid)
        self.d.prefill_done(r.rid)

    def finished(self, r: Req) -> None:
        self.dirty = True
        self.touched_pe.add(r.pe.eid)
        self.touched_de.add(r.de.eid)
        self.d.remove(r.rid)

    def read_done(self, r: Req, node: Node) -> None:
        self.dirty = True
        self.touched_nodes.add(node.nid)
        self.reads.read_done(r.rid, node.nid)

    def pending(self) -> bool:
        """Requests wait for engines and something changed since the last pull."""
        return self.dirty and (bool(self.rr_queue) if self.rr else self.d.waiting() > 0)

    def read_q(self, node: Node) -> int:
        return self.reads.pending.get(node.nid, 0)

    # pulls ------------------------------------------------------------------------------
    def tick(self) -> None:
        """Every group pulls once (the dispatcher rotates which prefill group goes first)."""
        self.dirty = False
        if self.rr:
            self._tick_rr()
            return
        self._refresh()
        for a in self.d.assign(self.pe_loads, self.de_loads):
            r = self.reqs.pop(a.req_id)
            r.pe, r.de = self.by_eid[a.pe], self.by_eid[a.de]
            self.on_assigned(r)

    def _refresh(self) -> None:
        led, pending = self.d.ledger, self.reads.pending
        if self.touched_pe:
            led.fill([self.pe_line[e] for e in self.touched_pe], "prefill")
            self.touched_pe.clear()
        if self.touched_de:
            led.fill([self.de_line[e] for e in self.touched_de if e in self.de_line], "decode")
            self.touched_de.clear()
        for nid in self.touched_nodes:
            q = pending.get(nid, 0)
            for line in self.lines_of_node.get(nid, ()):
                line.read_q = q
        self.touched_nodes.clear()

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
        force = self.force
        if self.rr and self.mode == "dualpath":
            self.rr_path += 1
            force = "pe" if self.rr_path % 2 else "de"
        blocks = -(-r.hit // self.block)
        pe_node, de_node = r.pe.node.nid, r.de.node.nid
        d = self.reads.decide(self.mode, blocks, pe_node, de_node, self.block, force=force)
        self.reads.hold(r.rid, d, pe_node, de_node, self.block)
        self.touched_nodes.add(pe_node)
        self.touched_nodes.add(de_node)
        pe_hit = min(r.hit, d.pe_blocks * self.block)
        return pe_hit, r.hit - pe_hit


def _line(e: Engine) -> EngineLoad:
    return EngineLoad(e.eid, capacity_tokens=e.cap, group=e.group.gid, node=e.node.nid)
