"""Scheduler micro-bench: dispatch rounds per second by cluster size, with requests in flight.

A round is the scheduler's: engine loads, then one `Dispatcher.assign`; requests churn between
rounds. Timed in CPU time; no NATS, no model.
"""
from __future__ import annotations

import argparse
import time
from collections import deque
from dataclasses import dataclass

from services.scheduler.placement import Lines, engine_loads
from services.scheduler.view import MeshView
from shared.messages.registry import EngineAnnounce, KVRegion, TrafficManagerAnnounce
from shared.sched.dispatch import Dispatcher, EngineLoad, Job
from shared.sched.policy import PeThresholds
from shared.sched.reads import PendingReads

PER_NODE = 8


@dataclass
class Rec:
    prompt: int
    gen: int
    pe: str = ""
    de: str = ""
    first_token: bool = False


def mesh(engines: int) -> MeshView:
    """`engines` live engines, the first half prefill, with room for any load."""
    view = MeshView(timeout_s=float("inf"))
    kv = KVRegion("bench", 1 << 22, 16, 1, 1, 1)
    for i in range(engines):
        eid, node = f"e{i:04d}", f"n{i // PER_NODE}"
        role = "prefill" if i < engines // 2 else "decode"
        view.update(EngineAnnounce(f"i{i}", node, engine=eid, role=role, kv=kv, total_blocks=kv.num_blocks), 0.0)
        view.update(TrafficManagerAnnounce(f"t{i}", node, engine=eid, ready=True), 0.0)
    return view


class DispatchMesh:
    """A scheduler's dispatch state with `inflight` requests placed, churned between rounds."""

    def __init__(self, engines: int, inflight: int, arrivals: int, recount: bool, kept: bool = False) -> None:
        self.view, self.reads = mesh(engines), PendingReads()
        self.d = Dispatcher(PeThresholds(alpha=1 << 40, beta=1 << 40))
        self.recs: dict[str, Rec] = {}
        self.order: deque[str] = deque()  # placed requests, oldest first
        self.last: list[str] = []
        self.recount, self.arrivals, self.n = recount, arrivals, 0
        self.lines = Lines() if kept else None
        self.arrive(inflight)
        while self.d.waiting():
            self.round()

    def arrive(self, k: int) -> None:
        for _ in range(k):
            rid, self.n = f"r{self.n}", self.n + 1
            self.recs[rid] = Rec(200 + self.n % 1800, 50 + self.n % 200)
            self.d.enqueue(Job(rid, self.recs[rid].prompt, self.recs[rid].gen))

    def loads(self, role: str) -> list[EngineLoad]:
        if not self.recount:
            return engine_loads(self.view, self.d.ledger, self.reads, role, 0.0)
        out = []  # the former way: every request in flight, for every engine
        for eng in self.view.assignable(role, 0.0):
            mine = [r for r in self.recs.values() if (r.pe if role == "prefill" else r.de) == eng.engine]
            if role == "prefill":
                held = [self.recs[q] for q, pe in self.d.pe_of.items() if pe == eng.engine and q in self.recs]
                mine = [r for r in mine if not r.first_token] + held
                tok = sum(r.prompt for r in mine)
            else:
                tok = sum(r.prompt + r.gen for r in mine)
            out.append(EngineLoad(eng.engine, tok=tok, seq=len(mine),
                                  capacity_tokens=eng.total_blocks * eng.kv.block_size, group=eng.group or eng.node,
                                  node=eng.node, read_q=self.reads.pending.get(eng.node, 0)))
        return out

    def round(self) -> None:
        if self.lines is not None:
            placed = self.d.assign(*self.lines.get(self.view, self.d.ledger, self.reads, 0.0), self.lines.changed)
        else:
            placed = self.d.assign(self.loads("prefill"), self.loads("decode"))
        for a in placed:
            rec = self.recs[a.req_id]
            rec.pe, rec.de = a.pe, a.de
            self.order.append(a.req_id)
        self.last = [a.req_id for a in placed]

    def churn(self) -> None:
        for rid in self.last:  # first tokens of last round's placements
            self.recs[rid].first_token = True
            self.d.prefill_done(rid)
        for _ in range(min(self.arrivals, len(self.order))):  # the oldest finish
            rid = self.order.popleft()
            del self.recs[rid]
            self.d.remove(rid)
        self.arrive(self.arrivals)


def rounds_per_s(engines: int, inflight: int, arrivals: int, seconds: float, recount: bool,
                 kept: bool = False) -> float:
    m = DispatchMesh(engines, inflight, arrivals, recount, kept)
    spent, rounds = 0.0, 0
    while spent < seconds or rounds < 3:
        m.churn()
        t0 = time.process_time()
        m.round()
        spent += time.process_time() - t0
        rounds += 1
    return rounds / spent


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m dualpath.bench.sched", description=__doc__.split("\n\n")[0])
    ap.add_argument("--engines", type=int, nargs="+", default=[8, 64, 512], help="cluster sizes to measure")
    ap.add_argument("--inflight", type=int, default=10_000, help="requests placed on the engines")
    ap.add_argument("--arrivals", type=int, default=32, help="requests arriving (and finishing) between rounds")
    ap.add_argument("--seconds", type=float, default=2.0, help="time spent in rounds per measurement")
    ap.add_argument("--no-recount", action="store_true", help="skip the former, recounting method")
    args = ap.parse_args(argv)
    for name, value in (("--inflight", args.inflight), ("--arrivals", args.arrivals), ("--seconds", args.seconds),
                        *(("--engines", e) for e in args.engines)):
        if value <= 0 or (name == "--engines" and value < 2):
            ap.error(f"{name} must be {'at least 2' if name == '--engines' else 'positive'}, got {value}")
    print(f"dispatch rounds per second, {args.inflight} requests in flight, {args.arrivals} arriving per round")
    print(f"{'engines':>8} {'kept':>10} {'ledger':>10} {'recount':>10}")
    for n in args.engines:
        kept = rounds_per_s(n, args.inflight, args.arrivals, args.seconds, recount=False, kept=True)
        new = rounds_per_s(n, args.inflight, args.arrivals, args.seconds, recount=False)
        old = "-" if args.no_recount else f"{rounds_per_s(n, args.inflight, args.arrivals, args.seconds, True):10.1f}"
        print(f"{n:>8} {kept:10.1f} {new:10.1f} {old:>10}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
