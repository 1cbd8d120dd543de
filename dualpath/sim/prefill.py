"""Prefill forward steps of a step unit, planned by the policy's intra-PE batcher.

A step lasts the longer of its compute and its EP all-to-all, but never less than the
layerwise load of its hit KV (`whole_first`: load, then compute, the batch's whole KV in HBM).
"""
from __future__ import annotations

from typing import Iterator

from dualpath.sim.cluster import Engine, StepUnit
from dualpath.sim.models import SimModel
from dualpath.sim.resources import Link
from dualpath.sim.traffic import H2D, LOAD, PD, PERSIST, READ
from dualpath.sim.workload import Req
from shared.sched.policy import PlannedChunk, ReadyPrefill, ReadPath, balanced_quota, plan_batch

# Stages compiled from dualpath.sim.traffic, so timing and the traffic table agree: per link
# of the stage (engine attribute, hit / miss / persist multiplicity), one reservation per
# link however many times the stage crosses it, the PE side's links and the DE side's apart.
KINDS = ("hit", "miss", "persist")
Row = tuple[str, int, int, int]  # (engine attribute, hit, miss, persist multiplicity)
LinkRow = tuple[Link, int, int, int]


class StageLinks:
    """One stage's links on each side, as indices into every engine's `rows` (`bind_stages`)."""

    __slots__ = ("pe", "de")

    def __init__(self, pe: int, de: int) -> None:
        self.pe = pe
        self.de = de


SIDES: list[tuple[Row, ...]] = []  # SIDES[i]: the rows an engine's rows[i] resolves


def _compile(hops: tuple[tuple[str, str, str], ...]) -> StageLinks:
    merged: dict[tuple[bool, str], list[int]] = {}
    for side, link, kind in hops:
        merged.setdefault((side == "pe", link), [0, 0, 0])[KINDS.index(kind)] += 1
    ids = []
    for pe_side in (True, False):
        SIDES.append(tuple((attr, c[0], c[1], c[2]) for (is_pe, attr), c in merged.items() if is_pe == pe_side))
        ids.append(len(SIDES) - 1)
    return StageLinks(ids[0], ids[1])


C_READ = {p: _compile(READ[p]) for p in ReadPath}
C_LOAD = {p: _compile(LOAD[p]) for p in ReadPath}
C_PD = {p: _compile(PD[p]) for p in ReadPath}
C_H2D = _compile(H2D)
C_PERSIST = _compile(PERSIST)


def bind_stages(engines: list[Engine]) -> None:
    """Resolve every stage's rows to each engine's own links, once (no lookups while booking)."""
    for e in engines:
        e.rows = [tuple((getattr(e, attr), ch, cm, cp) for attr, ch, cm, cp in side) for side in SIDES]


def book(now: float, st: StageLinks, r: Req, hit: float, miss: float, persist: float = 0.0) -> float:
    """Reserve one stage of request `r` (bytes multiplied out); returns when it ends."""
    end = now
    pe, de = r.pe, r.de
    assert pe is not None and de is not None
    for rows in (pe.rows[st.pe], de.rows[st.de]):
        for link, ch, cm, cp in rows:
            n = ch * hit + cm * miss + cp * persist
            if n > 0:  # Link.reserve, inlined: this is the simulator's hottest loop
                bw = link.bw
                dt = n / (bw * link.lo)
                t = link.free_at
                t = (t if t > now else now) + dt
                link.free_at = t
                link.busy += n / bw
                link.kv_time += dt
                link.bytes += n
                if t > end:
                    end = t
    return end


def stage_end(now: float, table: dict[ReadPath, StageLinks], r: Req, kvb: float, with_miss: bool = True) -> float:
    """Reserve a per-path stage for both parts of a (possibly split) read."""
    end = now
    miss = r.miss * kvb if with_miss else 0.0
    if r.pe_hit or (miss and not r.de_hit):
        end = book(now, table[ReadPath.PE], r, r.pe_hit * kvb, miss)
        miss = 0.0
    if r.de_hit or miss:
        t = book(now, table[ReadPath.DE], r, r.de_hit * kvb, miss)
        end = t if t > end else end
    return end


Planned = tuple[Engine, list[Req], list[PlannedChunk], float]  # engine, ready, its chunks, their attention s
INF = float("inf")


class Prefill:
    """Plans and times the forward steps of every step unit."""

    def __init__(self, model: SimModel, quota: float, align: int, oracle: bool, whole_first: bool = False,
                 traffic: float = 1.0, balance: float = 0.0) -> None:
        self.m = model
        self.quota = quota
        self.balance = balance  # > 0: cut the unit's batches to a budget keeping attention max/avg within it
        self.align = align
        self.oracle = oracle
        self.whole_first = whole_first
        self.comm = model.prefill_comm_bytes * traffic  # CNIC bytes per prefilled token
        self.attn = AttnBalance()
        # whole_first: a batch's whole KV (cached + new tokens, all layers) sits in HBM through its forward
        self.hbm = HbmCap(model.prefill_kv_tokens() if whole_first else INF)

    def plan(self, unit: StepUnit, now: float) -> float:
        """Fill unit.batch; returns the step duration (0 when nothing is ready)."""
        planned = self._planned(unit)
        if not planned:
            if unit.lanes:
                _lanes(unit.engines, now, None, 1.0)
                unit.lanes = False
            return 0.0
        m = self.m
        batch: list[tuple[Engine, list[Req], list[PlannedChunk]]] = []
        sent: list[tuple[Engine, float]] = []
        worst = pooled = attn_max = attn_sum = 0.0
        every_cut = True  # the quota (or HBM) cut every GPU's batch (each had more ready work than it)
        load_end = now
        for e, ready, chunks, attn in planned:
            if not chunks:
                batch.append((e, [], []))
                continue
            tokens = sum(c.bsz for c in chunks)
            lin = tokens * m.linear_s_per_token
            if self.comm:
                sent.append((e, tokens * self.comm))
            pooled += lin * m.pooled_fraction
            own = attn + lin * (1.0 - m.pooled_fraction)
            worst = own if own > worst else worst
            attn_max = attn if attn > attn_max else attn_max
            attn_sum += attn
            e.attn_s += attn
            if every_cut:
                last = ready[len(chunks) - 1]
                every_cut = len(chunks) < len(ready) or chunks[-1].bsz < last.miss - last.done
            if not self.oracle:
                load_end = _load_end(now, ready[:len(chunks)], m.kv_bytes, load_end)
            batch.append((e, ready[:len(chunks)], chunks))
        step = worst + pooled / len(unit.engines)
        if sent:
            t = m.comm_latency_s + max(max(e.cnic_r.model_burst(now, b), e.cnic_w.model_burst(now, b)) for e, b in sent)
            step = t if t > step else step
        unit.compute_s += step
        load = load_end - now
        step = step + load if self.whole_first else (step if step > load else load)
        if len(unit.engines) > 1 and attn_sum > 0 and all(chunks for _, _, chunks in batch):
            self.attn.add(attn_max, attn_sum, len(unit.engines), every_cut, step)
        if sent or unit.lanes:
            _lanes(unit.engines, now, dict(sent), step)
            unit.lanes = bool(sent)
        unit.batch = batch
        return step

    def _planned(self, unit: StepUnit) -> list[Planned]:
        """Each engine's batch under the quota, the unit's balanced budget and HBM; [] when none is ready."""
        att = self.m.attention
        planned: list[Planned] = []
        busy = False
        for e in unit.engines:
            ready = [r for r in e.queue if r.ready]
            if not ready:
                planned.append((e, ready, [], 0.0))
                continue
            chunks = plan_batch(self._work(ready), att, self.quota, self.align)
            planned.append((e, ready, chunks, att.batch_time((c.cached, c.bsz) for c in chunks)))
            busy = True
        if not busy:
            return []
        if self.balance and len(planned) > 1:
            cap = balanced_quota((a for _, _, _, a in planned), self.balance)
            for i, (e, ready, chunks, a) in enumerate(planned):
                if a > cap:  # cut to the unit's balanced budget: the rest waits for the next step
                    chunks = plan_batch(self._work(ready), att, cap, self.align)
                    planned[i] = (e, ready, chunks, att.batch_time((c.cached, c.bsz) for c in chunks))
        if self.hbm.tokens != INF:
            self._fit_hbm(planned)
        return planned

    def _fit_hbm(self, planned: list[Planned]) -> None:
        """Cut each engine's batch to the KV its HBM holds (the rest waits for the next step), and count."""
        att, cut = self.m.attention, False
        for i, (e, ready, chunks, a) in enumerate(planned):
            if not chunks:
                continue
            kept, over = fit_hbm(chunks, self.hbm.tokens, self.align)
            self.hbm.batches += 1
            self.hbm.over += 1 if over else 0
            if len(kept) < len(chunks) or kept[-1].bsz < chunks[len(kept) - 1].bsz:
                cut = True
                self.hbm.cut_batches += 1
                planned[i] = (e, ready, kept, att.batch_time((c.cached, c.bsz) for c in kept))
        self.hbm.steps += 1
        self.hbm.cut_steps += 1 if cut else 0

    @staticmethod
    def _work(ready: list[Req]) -> Iterator[ReadyPrefill]:
        return (ReadyPrefill(r.rid, r.hit + r.done, r.miss - r.done) for r in ready)


def fit_hbm(chunks: list[PlannedChunk], cap: float, align: int) -> tuple[list[PlannedChunk], bool]:
    """The chunks whose KV (cached + new tokens each) fits `cap` tokens: a prefix, its last chunk's new
    tokens cut to a multiple of `align` where some fit; a first chunk that alone exceeds the cap runs whole.
    Returns (kept, whether the kept batch is one chunk over the cap)."""
    used = 0
    for i, c in enumerate(chunks):
        need = c.cached + c.bsz
        if used + need <= cap:
            used += need
            continue
        room = int((cap - used - c.cached) // align * align)
        if room > 0:
            return chunks[:i] + [PlannedChunk(c.rid, c.cached, room)], False
        return (chunks[:i], False) if i else (chunks[:1], True)
    return chunks, False


class HbmCap:
    """Without layerwise prefill: the KV tokens a prefill GPU's HBM holds, and the steps and batches it cut."""

    __slots__ = ("tokens", "steps", "cut_steps", "batches", "cut_batches", "over")

    def __init__(self, tokens: float) -> None:
        self.tokens = tokens  # inf: no cap (layerwise, or HBM unknown)
        self.steps = self.cut_steps = 0  # step units' steps, and those where it cut some GPU's batch
        self.batches = self.cut_batches = 0  # per GPU
        self.over = 0  # batches of one chunk that alone exceeds the cap (run anyway)

    def figures(self, kv_bytes: float) -> dict[str, float]:
        if self.tokens == INF:
            return {}
        n, b = self.steps, self.batches
        return {"tokens": self.tokens, "gb": self.tokens * kv_bytes / 1e9, "steps": n, "cut_steps": self.cut_steps,
                "cut_share": self.cut_steps / n if n else 0.0, "batches": b, "cut_batches": self.cut_batches,
                "over": self.over}


class AttnBalance:
    """Attention time max/avg across a step unit's GPUs per step, quota-cut steps kept apart from the rest."""

    __slots__ = ("steps", "ratio_sum", "cut_steps", "cut_ratio_sum", "mean_sum", "wait_s", "step_s")

    def __init__(self) -> None:
        self.steps = self.cut_steps = 0
        self.ratio_sum = self.cut_ratio_sum = 0.0
        self.mean_sum = 0.0  # per step, the GPUs' mean attention time
        self.wait_s = 0.0  # per step, max - mean attention: what the other GPUs wait on average
        self.step_s = 0.0  # the counted steps' duration

    def add(self, worst: float, total: float, gpus: int, cut: bool, step: float) -> None:
        ratio = worst * gpus / total
        mean = total / gpus
        self.steps += 1
        self.ratio_sum += ratio
        self.mean_sum += mean
        self.wait_s += worst - mean
        self.step_s += step
        if cut:
            self.cut_steps += 1
            self.cut_ratio_sum += ratio

    def figures(self) -> dict[str, float]:
        nan = float("nan")
        n, k = self.steps, self.cut_steps
        return {"steps": n, "ratio": self.ratio_sum / n if n else nan,
                "cut_share": k / n if n else nan, "cut_ratio": self.cut_ratio_sum / k if k else nan,
                "uncut_ratio": (self.ratio_sum - self.cut_ratio_sum) / (n - k) if n > k else nan,
                "mean_attn_s": self.mean_sum / n if n else nan,
                "wait_share": self.wait_s / self.step_s if self.step_s else nan}


def _load_end(now: float, reqs: list[Req], kvb: float, end: float) -> float:
    """When the layerwise loads of the hit KV of `reqs` starting this step end (at least `end`)."""
    for r in reqs:
        if r.done == 0 and r.hit:
            t = stage_end(now, C_LOAD, r, kvb, with_miss=False)
            end = t if t > end else end
    return end


def _lanes(engines: list, now: float, sent: dict | None, step: float) -> None:
    """Each engine's CNICs carry its share of the step's model traffic (none when absent)."""
    for e in engines:
        u = min(1.0, sent.get(e, 0.0) / (e.cnic_r.bw * step)) if sent else 0.0
        e.cnic_r.set_model(now, u)
        e.cnic_w.set_model(now, u)
