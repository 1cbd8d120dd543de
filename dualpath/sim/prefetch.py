"""Prefetch during tool calls in the simulator: a hinted agent's stored KV read while its tool call runs.

The mesh's own policy picks the side and the start; the next turn's prefetched tokens skip the
read. Links are FIFO, so unhinted reads may queue behind a prefetch; buffer room is not modelled.
"""
from __future__ import annotations

from dataclasses import dataclass

from dualpath.sim.resources import transfer
from shared.sched.prefetch import Holder, RecentBytes, plan


@dataclass
class Booked:
    tokens: int  # leading hit tokens prefetched
    node: object  # the sim Node whose SNIC read them
    pe_side: bool
    ready_at: float = float("inf")  # when the read ends (inf: not started yet)
    started: bool = False
    cancelled: bool = False


class SimPrefetch:
    def __init__(self, sim, hints: str) -> None:
        self.sim, self.hints = sim, hints
        self.booked: dict[int, Booked] = {}  # agent -> its next turn's prefetch
        self.bulk: dict[int, float] = {}  # node id -> prefetch bytes booked, not yet read
        self.recent = RecentBytes()  # node id -> prefetch bytes started lately (as the scheduler counts)
        self.bytes = 0.0  # prefetched bytes in all
        self.late = 0  # turns that arrived while their prefetch was still reading

    def hinted(self, agent: int) -> bool:
        return self.hints == "on" or (self.hints == "mixed" and agent % 2 == 0)

    # a turn ended; its tool call starts ---------------------------------------------------
    def turn_done(self, agent: int, ctx: int, tool_s: float) -> None:
        sim = self.sim
        block = sim.w.block
        tokens = (ctx // block) * block  # what the next turn will hit (whole stored blocks)
        if tool_s <= 0 or tokens <= 0 or not self.hinted(agent):
            return
        kvb, now = sim.kvb, sim.now
        force = "auto" if sim.sched.mode.both_paths else "pe"  # basic (and sglang): the PE path only
        p = plan(tokens // block, block * kvb, now, now + tool_s, self._holders(kvb), force=force)
        assert p is not None  # every node holds prefetch room
        node = next(n for n in sim.c.nodes if n.nid == p.node)
        b = self.booked[agent] = Booked(tokens, node, node.role == "p")
        sim.push(p.start_at, self._start, (agent, b))

    def _holders(self, kvb: int) -> list[Holder]:
        pending, now = self.sim.sched.reads.pending, self.sim.now
        return [Holder(n.nid, n.nid, "prefill" if n.role == "p" else "decode", 1 << 30,
                       pending.get(n.nid, 0) * kvb + self.bulk.get(n.nid, 0.0) + self.recent.get(n.nid, now),
                       n.snic_r.bw) for n in self.sim.c.nodes]

    def _start(self, arg) -> None:
        agent, b = arg
        if b.cancelled:
            return
        nbytes = b.tokens * self.sim.kvb
        b.started = True
        b.ready_at = transfer(self.sim.now, [(b.node.snic_r, nbytes), (b.node.dram, nbytes)])
        self.bulk[b.node.nid] = self.bulk.get(b.node.nid, 0.0) + nbytes
        self.recent.add(b.node.nid, nbytes, self.sim.now)
        self.bytes += nbytes
        self.sim.push(b.ready_at, self._read, (b.node.nid, nbytes))

    def _read(self, arg) -> None:
        nid, nbytes = arg
        self.bulk[nid] -= nbytes

    # the next turn --------------------------------------------------------------------------
    def serve(self, r) -> bool:
        """Issue `r`'s reads when part of its hit was prefetched (True); False: read as usual."""
        b = self.booked.pop(r.agent, None)
        if b is None:
            return False
        if not b.started:  # back before the prefetch started: read at arrival
            b.cancelled = True
            return False
        sim, block = self.sim, self.sim.w.block
        pf = min(b.tokens, r.hit)
        rest = -(-(r.hit - pf) // block)
        pe_node, de_node = r.pe.node.nid, r.de.node.nid
        d = sim.sched.reads.decide(sim.sched.mode, rest, pe_node, de_node, block)
        sim.sched.reads.hold(r.rid, d, pe_node, de_node, block)
        pe_rest = min(r.hit - pf, d.pe_blocks * block)
        de_rest = r.hit - pf - pe_rest
        r.pe_hit, r.de_hit = (pf + pe_rest, de_rest) if b.pe_side else (pe_rest, pf + de_rest)
        r.reads_left = 0
        for tokens, eng in ((pe_rest, r.pe), (de_rest, r.de)):  # what storage still reads at arrival
            if tokens:
                nbytes = tokens * sim.kvb
                r.reads_left += 1
                sim.push(transfer(sim.now, [(eng.node.snic_r, nbytes), (eng.node.dram, nbytes)]), sim._read_done,
                         (r, eng.node, tokens))
        if b.ready_at > sim.now:  # still reading: the turn waits for the rest of it
            self.late += 1
            r.reads_left += 1
            sim.push(b.ready_at, self._waited, r)
        if r.reads_left == 0:
            sim._make_ready(r)
        return True

    def _waited(self, r) -> None:
        r.reads_left -= 1
        if r.reads_left == 0:
            self.sim._make_ready(r)
