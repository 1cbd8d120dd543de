"""Prefill forward steps of a step unit, planned by the policy's intra-PE batcher.

A step: every engine of the unit plans a batch from its ready requests (FIFO, compute
quota, chunked prefill by binary search: `policy.plan_batch`); the step lasts
  max_e(attention_e + non-pooled GEMMs_e) + pooled expert GEMMs / engines
(attention DP waits for the slowest GPU before the EP stage), but never less than the
layerwise load of the hit KV of the requests starting in it (load overlaps compute).
A request that finishes its prefill streams its KV to the DE during the step (PD
transfer), then the DE copies it into HBM.
"""
from __future__ import annotations

from dualpath.sim.cluster import StepUnit
from dualpath.sim.models import SimModel
from dualpath.sim.resources import transfer
from dualpath.sim.traffic import H2D, LOAD, PD, PERSIST, READ
from dualpath.sim.workload import Req
from shared.sched.policy import PrefillWork, ReadPath, plan_batch

# Stages compiled from dualpath.sim.traffic, so timing and the traffic table agree:
# (side is PE?, link lives on the node?, link attribute, bytes kind).


def _compile(hops) -> tuple:
    return tuple((side == "pe", not link.startswith("cnic"), link, kind) for side, link, kind in hops)


C_READ = {p: _compile(READ[p]) for p in ReadPath}
C_LOAD = {p: _compile(LOAD[p]) for p in ReadPath}
C_PD = {p: _compile(PD[p]) for p in ReadPath}
C_H2D = _compile(H2D)
C_PERSIST = _compile(PERSIST)


def legs(hops: tuple, r: Req, hit: float, miss: float, persist: float = 0.0) -> list:
    """(Link, bytes) pairs of one stage of request `r` (bytes already multiplied out)."""
    out = []
    for is_pe, on_node, attr, kind in hops:
        n = hit if kind == "hit" else miss if kind == "miss" else persist
        if n > 0:
            eng = r.pe if is_pe else r.de
            out.append((getattr(eng.node if on_node else eng, attr), n))
    return out


def stage_end(now: float, table: dict, r: Req, kvb: int, with_miss: bool = True) -> float:
    """Reserve a per-path stage for both parts of a (possibly split) read."""
    lg = []
    miss = r.miss * kvb if with_miss else 0.0
    if r.pe_hit or (miss and not r.de_hit):
        lg += legs(table[ReadPath.PE], r, r.pe_hit * kvb, miss)
        miss = 0.0
    if r.de_hit or miss:
        lg += legs(table[ReadPath.DE], r, r.de_hit * kvb, miss)
    return transfer(now, lg)


class Prefill:
    """Plans and times the forward steps of every step unit."""

    def __init__(self, model: SimModel, quota: float, align: int, oracle: bool) -> None:
        self.m = model
        self.quota = quota
        self.align = align
        self.oracle = oracle
        self.attn_ratio_sum = 0.0  # over steps where every GPU had work: max/avg attention time
        self.steps = 0

    def plan(self, unit: StepUnit, now: float) -> float:
        """Fill unit.batch; returns the step duration (0 when nothing is ready)."""
        m, att = self.m, self.m.attention
        batch = []
        worst = pooled = attn_max = attn_sum = 0.0
        load_end = now
        for e in unit.engines:
            ready = [r for r in e.queue if r.ready]
            if not ready:
                batch.append((e, [], []))
                continue
            work = (PrefillWork(r.rid, r.hit + r.done, r.miss - r.done) for r in ready)
            chunks = plan_batch(work, att, self.quota, self.align)
            attn = att.batch_time((c.cached, c.bsz) for c in chunks)
            lin = sum(c.bsz for c in chunks) * m.linear_s_per_token
            pooled += lin * m.pooled_fraction
            own = attn + lin * (1.0 - m.pooled_fraction)
            worst = own if own > worst else worst
            attn_max = attn if attn > attn_max else attn_max
            attn_sum += attn
            e.attn_s += attn
            if not self.oracle:
                for i in range(len(chunks)):
                    r = ready[i]
                    if r.done == 0 and r.hit:
                        t = stage_end(now, C_LOAD, r, m.kv_bytes, with_miss=False)
                        load_end = t if t > load_end else load_end
            batch.append((e, ready[:len(chunks)], chunks))
        if attn_sum == 0.0:
            return 0.0
        if len(unit.engines) > 1 and all(chunks for _, _, chunks in batch):
            self.attn_ratio_sum += attn_max * len(unit.engines) / attn_sum
            self.steps += 1
        step = worst + pooled / len(unit.engines)
        unit.batch = batch
        return max(step, load_end - now)
