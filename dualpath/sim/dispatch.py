"""The simulator's side of the shared `Dispatcher`: engine loads in, engine pairs out, on simulated time.

Owns nothing of the policy: pulls are `Dispatcher.assign`, fed what the scheduler service
feeds it. Prefill groups pull in turn, each at its own phase; the decode groups once a period.
"""
from __future__ import annotations

from collections import deque
from typing import Callable, cast

from dualpath.sim.cluster import Cluster, Engine, Node
from dualpath.sim.workload import Req
from shared.messages.codes import LoadMode
from shared.sched.dispatch import Dispatcher, EngineLoad, Job
from shared.sched.ledger import Id
from shared.sched.policy import PeThresholds
from shared.sched.reads import PendingReads

Assigned = Callable[[Req], None]  # called once a request holds both engines (r.pe, r.de set)


class SimDispatch:
    def __init__(self, cluster: Cluster, th: PeThresholds, mode: LoadMode, assign: str,
                 on_assigned: Assigned, block_tokens: int) -> None:
        self.c = cluster
        self.mode = mode  # dualpath: every hit on the shorter queue; dualpath-split: split (PendingReads.decide)
        self.rr = assign == "rr"
        self.on_assigned = on_assigned
        self.block = block_tokens
        self.d = Dispatcher(th)
        self.reads = PendingReads()
        self.reqs: dict[Id, Req] = {}  # submitted, not yet given both engines
        self.by_eid = cluster.engines
        self.pe_loads = [_line(e) for e in cluster.pes]  # one line per engine, kept current (below)
        self.de_loads = [_line(e) for e in cluster.des]
        # The dispatcher updates the lines of what it places itself; what changes its ledger or
        # the read queues outside a pull is noted here and copied into the lines at the next pull
        # (the same figures as a full refresh, for the engines and nodes that changed only).
        self.pe_line = {e.eid: line for e, line in zip(cluster.pes, self.pe_loads)}
        self.de_line = {e.eid: line for e, line in zip(cluster.des, self.de_loads)}
        self.lines_of_node: dict[Id, list[EngineLoad]] = {}
        for line in self.pe_loads:
            self.lines_of_node.setdefault(line.node, []).append(line)
        self.touched_pe: set[int] = set()
        self.touched_de: set[int] = set()
        self.touched_nodes: set[int] = set()
        self.rr_queue: deque[Req] = deque()
        self.rr_pe = self.rr_de = self.rr_path = 0
        self.pe_groups = [[self.pe_line[e.eid] for e in g.engines] for g in cluster.pe_groups]
        # `version` counts changes to what a pull reads; a group that pulled at the current
        # version would place nothing (a pull leaves a fixed point), so it is skipped
        self.version = 0
        self.pulled = [-1] * len(self.pe_groups)  # version at each prefill group's last pull
        self.fresh = 0  # prefill groups that pulled at the current version
        self.de_pulled = -1  # version at the decode groups' last pull

    # what the mesh tells the scheduler -------------------------------------------------
    def submit(self, r: Req) -> None:
        self.version += 1
        self.fresh = 0
        if self.rr:
            self.rr_queue.append(r)
            return
        self.reqs[r.rid] = r
        self.d.enqueue(Job(r.rid, r.prompt, r.gen))

    def prefill_done(self, r: Req) -> None:
        self._changed()
        assert r.pe is not None
        self.touched_pe.add(r.pe.eid)
        self.d.prefill_done(r.rid)

    def finished(self, r: Req) -> None:
        self._changed()
        assert r.pe is not None and r.de is not None
        self.touched_pe.add(r.pe.eid)
        self.touched_de.add(r.de.eid)
        self.d.remove(r.rid)

    def read_done(self, r: Req, node: Node) -> None:
        self._changed()
        self.touched_nodes.add(node.nid)
        self.reads.read_done(r.rid, node.nid)

    def pending(self) -> bool:
        """Requests wait for engines and something changed since some group's last pull."""
        stale = self.fresh < len(self.pulled) or self.de_pulled != self.version
        return stale and (bool(self.rr_queue) if self.rr else self.d.waiting() > 0)

    @property
    def n_groups(self) -> int:
        return len(self.pe_groups)

    def stale(self, k: int) -> bool:
        """Would the pull at grid point k (prefill group k % n, decode groups at k % n == 0) do anything?"""
        g = k % len(self.pulled)
        return self.pulled[g] != self.version or (g == 0 and self.de_pulled != self.version)

    def _changed(self) -> None:
        self.version += 1
        self.fresh = 0

    def read_q(self, node: Node) -> int:
        return self.reads.pending.get(node.nid, 0)

    # pulls ------------------------------------------------------------------------------
    def tick(self, k: int = 0) -> None:
        """Grid point k: prefill group k % n pulls (decode groups too at k % n == 0); others become stale."""
        g = k % len(self.pulled)
        if self.pulled[g] != self.version and not self.rr:
            if self.d.queue:  # (with none waiting for a PE the pull places nothing: lines refresh later)
                self._refresh()
                if self.d.pull_prefill(self.pe_groups[g]):
                    self._changed()
            if self.pulled[g] != self.version:
                self.fresh += 1
            self.pulled[g] = self.version
        if g != 0 or self.de_pulled == self.version:
            return
        if self.rr:
            placed = self._tick_rr()
        else:  # (the decode pull reads the decode lines only)
            changed = self._refresh_de()
            placed = 0
            for a in self.d.pull_decode(self.de_loads, changed):
                r = self.reqs.pop(a.req_id)
                r.pe, r.de = self.by_eid[cast(int, a.pe)], self.by_eid[cast(int, a.de)]
                self.on_assigned(r)
                placed += 1
        if placed:
            self._changed()
        self.de_pulled = self.version
        if self.rr:
            self.pulled = [self.version] * len(self.pulled)
            self.fresh = len(self.pulled)

    def _refresh(self) -> None:
        led, pending = self.d.ledger, self.reads.pending
        if self.touched_pe:
            led.fill([self.pe_line[e] for e in self.touched_pe], "prefill")
            self.touched_pe.clear()
        for nid in self.touched_nodes:
            q = pending.get(nid, 0)
            for line in self.lines_of_node.get(nid, ()):
                line.read_q = q
        self.touched_nodes.clear()

    def _refresh_de(self) -> list[int]:
        """Refresh the decode lines whose ledger figures moved since the last pull; returns their engines."""
        changed = [e for e in self.touched_de if e in self.de_line]
        self.d.ledger.fill([self.de_line[e] for e in changed], "decode")
        self.touched_de.clear()
        return changed

    def _tick_rr(self) -> int:
        pes, des, led = self.c.pes, self.c.des, self.d.ledger
        placed = 0
        while self.rr_queue:
            r = self.rr_queue[0]
            for k in range(len(des)):
                e = des[(self.rr_de + k) % len(des)]
                if e.cap - led.de_load(e.eid)[0] >= r.mem:
                    break
            else:
                return placed  # no decode engine has room: the head waits
            self.rr_queue.popleft()
            self.rr_de += k + 1
            pe = r.pe = pes[self.rr_pe % len(pes)]
            r.de = e
            self.rr_pe += 1
            led.charge_pe(r.rid, pe.eid, r.prompt)
            led.charge_de(r.rid, e.eid, r.mem)
            self.on_assigned(r)
            placed += 1
        return placed

    # read paths -------------------------------------------------------------------------
    def split_hit(self, r: Req) -> tuple[int, int]:
        """(hit tokens on the PE path, on the DE path); reads wait on the nodes' queues until `read_done`."""
        if r.hit == 0:
            return 0, 0
        force = "auto"  # the mode's own rule
        if self.rr and self.mode.both_paths:
            self.rr_path += 1
            force = "pe" if self.rr_path % 2 else "de"
        blocks = -(-r.hit // self.block)
        assert r.pe is not None and r.de is not None
        pe_node, de_node = r.pe.node.nid, r.de.node.nid
        d = self.reads.decide(self.mode, blocks, pe_node, de_node, self.block, force=force)
        self.reads.hold(r.rid, d, pe_node, de_node, self.block)
        self.touched_nodes.add(pe_node)
        self.touched_nodes.add(de_node)
        pe_hit = min(r.hit, d.pe_blocks * self.block)
        return pe_hit, r.hit - pe_hit


def _line(e: Engine) -> EngineLoad:
    assert e.group is not None
    return EngineLoad(e.eid, capacity_tokens=e.cap, group=e.group.gid, node=e.node.nid)
