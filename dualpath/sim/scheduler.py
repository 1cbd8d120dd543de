"""The simulated request scheduler: queues, periodic group pulls, path choice.

Holds the same state as the scheduler service (a global PE FIFO, a global DE pool,
a private queue per DE group) and decides through `services.scheduler.policy`, called
unchanged. The "rr" variant is the round-robin baseline: engines in turn, read paths
alternating, no live signals.
"""
from __future__ import annotations

from collections import deque
from typing import Callable

from dualpath.sim.cluster import Cluster, Engine, Group
from dualpath.sim.workload import Req
from services.scheduler.policy import (EngineReport, PeThresholds, ReadPath, Request,
                                       assign_decode, assign_prefill, choose_path,
                                       pick_de_group, split_read)

Assign = Callable[[Req, Engine], None]


class SimScheduler:
    def __init__(self, cluster: Cluster, th: PeThresholds, mode: str, assign: str,
                 split: bool, on_pe: Assign, on_de: Assign, read_rate: float) -> None:
        self.c = cluster
        self.th = th
        self.mode = mode
        self.rr = assign == "rr"
        self.split = split
        self.on_pe = on_pe
        self.on_de = on_de
        self.read_rate = read_rate  # tokens/s one node reads (for split_read)
        self.pe_queue: deque[Request] = deque()
        self.de_pool: deque[Request] = deque()
        self.reqs: dict[int, Req] = {}
        self.turn = 0  # rotates which group pulls first in a tick
        self.rr_pe = self.rr_de = self.rr_path = 0
        self.by_eid = cluster.engines

    def submit(self, r: Req) -> None:
        self.reqs[r.rid] = r
        self.pe_queue.append(Request(r.rid, r.prompt))

    def pending(self) -> bool:
        return bool(self.pe_queue or self.de_pool or any(g.private for g in self.c.de_groups))

    def tick(self) -> None:
        """Every group pulls once, starting with a different group each tick."""
        if self.rr:
            self._tick_rr()
            return
        self.turn += 1
        pe, de = self.c.pe_groups, self.c.de_groups
        for i in range(len(pe)):
            if not self.pe_queue:
                break
            self._pull_pe(pe[(self.turn + i) % len(pe)])
        for i in range(len(de)):
            self._pull_de(de[(self.turn + i) % len(de)])

    def _pull_pe(self, g: Group) -> None:
        beta = self.th.beta
        if all(e.tok > beta for e in g.engines):
            return  # every engine is class 1: the pull would return nothing
        reports = [EngineReport(e.eid, e.node.nid, e.seq, e.tok, e.node.read_q) for e in g.engines]
        for a in assign_prefill(self.pe_queue, reports, self.th):
            self._give_pe(self.reqs[a.rid], self.by_eid[a.engine])

    def _pull_de(self, g: Group) -> None:
        if self.de_pool:
            totals = {x.gid: x.tok + x.queued for x in self.c.de_groups}
            target = self.c.de_groups[pick_de_group(totals) - self.c.de_groups[0].gid]
            target.private.extend(self.de_pool)
            target.queued += sum(r.tokens for r in self.de_pool)
            self.de_pool = deque()
        if not g.private:
            return
        smallest = min(r.mem for r in g.private) if len(g.private) < 8 else g.private[0].mem
        if all(e.free < smallest for e in g.engines):
            return
        reports = [EngineReport(e.eid, e.node.nid, e.seq, e.tok, e.node.read_q, e.free) for e in g.engines]
        for a in assign_decode(g.private, reports):
            r = self.reqs[a.rid]
            g.queued -= r.mem
            self._give_de(r, self.by_eid[a.engine])

    def _give_pe(self, r: Req, e: Engine) -> None:
        e.tok += r.prompt
        e.seq += 1
        e.group.tok += r.prompt
        r.pe = e
        # A request enters the DE pool only once it holds a PE: DE memory is reserved
        # at assignment, so reserving it for requests still queued for a PE could
        # deadlock (full PEs waiting for DE memory held by requests waiting for a PE).
        self.de_pool.append(Request(r.rid, r.mem, r.mem))
        self.on_pe(r, e)

    def _give_de(self, r: Req, e: Engine) -> None:
        e.tok += r.mem
        e.seq += 1
        e.free -= r.mem
        e.group.tok += r.mem
        r.de = e
        del self.reqs[r.rid]
        self.on_de(r, e)

    def _tick_rr(self) -> None:
        pes, des = self.c.pes, self.c.des
        while self.pe_queue:
            r = self.reqs[self.pe_queue.popleft().rid]
            self._give_pe(r, pes[self.rr_pe % len(pes)])
            self.rr_pe += 1
        while self.de_pool:
            need = self.de_pool[0].mem
            for k in range(len(des)):
                e = des[(self.rr_de + k) % len(des)]
                if e.free >= need:
                    self.rr_de += k + 1
                    self._give_de(self.reqs[self.de_pool.popleft().rid], e)
                    break
            else:
                return

    def split_hit(self, r: Req) -> tuple[int, int]:
        """(hit tokens on the PE path, on the DE path) once both engines are known."""
        if self.mode != "dualpath" or r.hit == 0:
            return r.hit, 0
        pq, dq = r.pe.node.read_q, r.de.node.read_q
        if self.rr:
            self.rr_path += 1
            return (r.hit, 0) if self.rr_path % 2 else (0, r.hit)
        if self.split:
            blocks = -(-r.hit // 64)
            pb, _ = split_read(blocks, pq, dq, self.read_rate, self.read_rate)
            pe_hit = min(r.hit, pb * 64)
            return pe_hit, r.hit - pe_hit
        return (r.hit, 0) if choose_path(pq, dq) is ReadPath.PE else (0, r.hit)
