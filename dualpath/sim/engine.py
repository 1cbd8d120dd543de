"""The event loop: requests flow queue -> assign -> read -> prefill -> PD -> decode.

Events are (time, seq, handler, arg) in one heap; links are fluid servers, so queues cost no
events. Offline, all agents start at t=0; online, by a Poisson process until the stop rule.
"""
from __future__ import annotations

import gc
import heapq
import itertools
import time
from typing import Any, Callable

from dualpath.sim.cluster import Cluster, Engine, Node, StepUnit
from dualpath.sim.collectives import Layout
from dualpath.sim.config import SGLANG, SimConfig
from dualpath.sim.dispatch import SimDispatch
from dualpath.sim.hardware import load_hardware
from dualpath.sim.hostcpu import DECODE, PREFILL, HostPool, KvCpu
from dualpath.sim.metrics import SimResult, collect
from dualpath.sim.models import Rates, SimModel, build_model
from dualpath.sim.online import StopRule
from dualpath.sim.prefetch import SimPrefetch
from dualpath.sim.prefill import C_H2D, C_PD, C_PERSIST, Prefill, bind_stages, book, stage_end
from dualpath.sim.resources import transfer
from dualpath.sim.stored import WriteLag
from dualpath.sim.workload import Req, SimWorkload, load_workload, make_request
from shared.messages.codes import LoadMode
from shared.sched.policy import PeThresholds


Handler = Callable[[Any], None]  # an event's handler, called with its argument


class Simulation:
    def __init__(self, cfg: SimConfig, model: SimModel | None = None, workload: SimWorkload | None = None,
                 thresholds: PeThresholds | None = None) -> None:
        self.cfg = cfg
        self.hw = load_hardware(cfg.hardware) if isinstance(cfg.hardware, str) else cfg.hardware
        pe = Layout(min(cfg.pe_ep_nodes, cfg.P), self.hw.gpus, cfg.attn_tp)
        de = Layout(min(cfg.de_ep_nodes, cfg.D), self.hw.gpus, cfg.attn_tp)
        self.model = model or build_model(cfg.model, self.hw, pe, de,
                                          Rates(prefill_eff=cfg.prefill_eff, decode_eff=cfg.decode_eff))
        self.c = Cluster(cfg.P, cfg.D, self.hw, self.model, cfg.group_nodes, pe.ep_nodes, cfg.model_traffic)
        bind_stages(self.c.engines)
        self.w = workload or load_workload(cfg.trace, cfg.agents, cfg.scale, cfg.seed, cfg.aps, cfg.block_tokens,
                                           cfg.tool_calls, cfg.append_scale)
        self.kvb = self.model.kv_bytes
        self.oracle = isinstance(cfg.mode, LoadMode) and not cfg.mode.moves_kv  # SGLANG moves KV
        self.whole_first = cfg.whole_prompt_first and not self.oracle
        self.th = thresholds or self._thresholds()
        self.sched = SimDispatch(self.c, self.th, LoadMode.BASIC if cfg.reads_on_pe_only else LoadMode(cfg.mode),
                                 cfg.assign_kind, self._on_assigned, self.w.block)
        self.sched.reads.near_tie = cfg.read_near_tie  # the dispatcher's constructor is at its 6 parameters
        self.prefill = Prefill(self.model, cfg.quota_s, cfg.chunk_align, self.oracle, self.whole_first,
                               cfg.model_traffic, cfg.attn_balance)
        if self.whole_first and cfg.pe_free_hbm_gb > 0:  # the constructor is at its 7 parameters
            self.prefill.hbm.tokens = self.model.prefill_kv_tokens(cfg.pe_free_hbm_gb * 1e9)
        self.heap: list[tuple[float, int, Handler, Any]] = []
        self.think_s = cfg.think_s
        self.pull_s = cfg.pull_s
        self._seq = itertools.count()
        self.now = 0.0
        self.events = 0
        self.tick_armed = False
        n = len(self.w.agents)
        self.ctx = [0] * n
        self.turn = [0] * n
        self.next_rid = 0
        self.agents_done = 0
        self.end_t = 0.0
        self.t_arrive: list[float] = []
        self.ttft: list[float] = []
        self.ttst: list[float] = []
        self.tpot: list[float] = []
        self.finished = 0
        self.bar: Any = None  # a tqdm bar while progress is shown (Any: the compiled build checks types)
        self.pf = SimPrefetch(self, cfg.hints) if cfg.hints != "off" and not self.oracle else None
        self.kvcpu = KvCpu(cfg.kv_cpu_s_per_byte) if cfg.kv_cpu_s_per_byte > 0 and not self.oracle else None
        self.pool = HostPool(cfg.host_cores, cfg.background_cores, cfg.host_corun_prefill,
                             cfg.host_corun_decode) if cfg.host_cores > 0 else None
        self.lag = WriteLag(self.w.block) if cfg.write_lag and not self.oracle else None
        self.after_tool: dict[int, bool] = {}  # rid -> the turn followed a tool call
        self.ttft_after_tool: list[tuple[bool, float]] = []  # (its agent hinted, TTFT) of those turns
        self.online = cfg.aps > 0
        self.judge = None
        if self.online:
            cap = cfg.duration_s if cfg.duration_s > 0 else 2 * cfg.steady_lag_s + cfg.window_s
            self.judge = StopRule(cfg.window_s, cfg.steady_lag_s, cfg.steady_tol, cfg.slo_ttft_s, cfg.slo_tpot_s,
                                  cap)

    def _thresholds(self) -> PeThresholds:
        """alpha: tokens a node reads in alpha_s; beta: prompt tokens one PE handles in beta_s."""
        alpha = int(self.hw.snic_bw / self.kvb * self.cfg.alpha_s)
        hit = self.w.hit_ratio()
        per_new = self.model.prefill_tokens_per_s(16384, 512)
        beta = int(per_new / max(1.0 - hit, 0.01) * self.cfg.beta_s)
        return PeThresholds(alpha=alpha, beta=beta)

    # --- event plumbing -------------------------------------------------------------
    def push(self, t: float, fn: Handler, arg: Any) -> None:
        heapq.heappush(self.heap, (t, next(self._seq), fn, arg))

    def run(self) -> SimResult:
        wall = time.perf_counter()
        for a, t in enumerate(self.w.starts):
            self.push(t, self._arrive, a)
        if self.judge is not None:
            self.push(self.cfg.window_s, self._judge, None)
        total = self.w.total_requests
        if self.cfg.progress:
            from tqdm import tqdm
            self.bar = tqdm(total=total, unit="req", mininterval=1.0, smoothing=0.1)
        heap, pop = self.heap, heapq.heappop
        self.stopped = False
        # The loop makes no reference cycles (what it drops, reference counting frees), so the
        # cycle collector's passes over the live requests are skipped (a few percent at most).
        collecting = gc.isenabled()
        gc.disable()
        try:
            while heap and not self.stopped:
                t, _, fn, arg = pop(heap)
                self.now = t
                fn(arg)
                self.events += 1
        finally:
            if collecting:
                gc.enable()
        if self.bar is not None:
            self.bar.update(self.finished - self.bar.n)
            self.bar.close()
        for link in self.c.links():
            link.finish(self.now)
        span = self.now if self.online else self.end_t
        return collect(self, span, time.perf_counter() - wall)

    def _judge(self, _: None) -> None:
        assert self.judge is not None  # armed only online
        if self.judge.check(self.now) is not None:
            self.stopped = True
        else:
            self.push(self.now + self.cfg.window_s, self._judge, None)

    def _arm_tick(self) -> None:
        """The next pull on a grid of pull_s / n (prefill group k % n; decode groups at k % n == 0)."""
        if not self.tick_armed:
            self.tick_armed = True
            n = self.sched.n_groups
            p = self.pull_s / n
            k = int(self.now / p + 1e-6) + 1  # next grid point strictly after now
            for _ in range(n):
                if self.sched.stale(k):
                    break
                k += 1
            self.push(k * p, self._tick, k)

    def _tick(self, k: int) -> None:
        self.sched.tick(k)
        self.tick_armed = False
        if self.sched.pending():
            self._arm_tick()

    # --- request lifecycle ------------------------------------------------------------
    def _arrive(self, a: int) -> None:
        append, gen = self.w.turn(a, self.turn[a])
        r = make_request(self.next_rid, a, self.ctx[a], append, gen, self.now, self.w.block,
                         self.lag.stored(a, self.now) if self.lag is not None else -1)
        if self.turn[a] and self.w.tool_after(a, self.turn[a] - 1) > 0:
            self.after_tool[r.rid] = True
        self.next_rid += 1
        if self.judge is not None:
            self.judge.arrived(self.now)
        self.sched.submit(r)
        self._arm_tick()

    def _on_assigned(self, r: Req) -> None:
        assert r.pe is not None and r.de is not None
        r.pe.queue.append(r)
        if self.oracle:
            r.reads_left = 0
            self._make_ready(r)
            return
        if self.pf is not None and self.pf.serve(r):  # part of its hit was prefetched during a tool call
            return
        pe_hit, de_hit = self.sched.split_hit(r)
        self._issue_reads(r, pe_hit, de_hit)

    def _issue_reads(self, r: Req, pe_hit: int, de_hit: int) -> None:
        r.pe_hit, r.de_hit = pe_hit, de_hit
        r.reads_left = 0
        for tokens, eng in ((pe_hit, r.pe), (de_hit, r.de)):
            if tokens:
                assert eng is not None
                node = eng.node
                nbytes = tokens * self.kvb
                end = transfer(self.now, [(node.snic_r, nbytes), (node.dram, nbytes)])
                r.reads_left += 1
                self.push(end, self._read_done, (r, node, tokens))
        if r.reads_left == 0:
            self._make_ready(r)

    def _read_done(self, arg: tuple[Req, Node, int]) -> None:
        r, node, _tokens = arg
        self.sched.read_done(r, node)
        if self.sched.pending():
            self._arm_tick()
        r.reads_left -= 1
        if r.reads_left == 0:
            self._make_ready(r)

    def _make_ready(self, r: Req) -> None:
        r.ready = True
        assert r.pe is not None and r.pe.unit is not None
        self._kick(r.pe.unit)

    def _kick(self, unit: StepUnit) -> None:
        if unit.busy:
            return
        dt = self.prefill.plan(unit, self.now)
        if dt > 0:
            if self.kvcpu is not None:
                self._kv_owed(unit)  # what the storage path used while the unit was idle is free
            if self.pool is not None:
                dt *= self.pool.slow(self._busy_engines() + len(unit.engines), PREFILL)
            unit.busy = True
            unit.busy_s += dt
            unit.t_start = self.now
            self.push(self.now + dt, self._step_end, unit)
            if self.pool is not None:
                self._pool_update()

    def _busy_engines(self) -> int:
        d = sum(1 for e in self.c.des if e.decode is not None and e.decode.n)
        return d + sum(len(u.engines) for u in self.c.units if u.busy)

    def _pool_update(self) -> None:
        """Every running decode batch steps at the speed the host's busy engines leave it."""
        assert self.pool is not None
        slow = self.pool.slow(self._busy_engines(), DECODE)
        for e in self.c.des:
            d = e.decode
            if d is not None and d.n and d.slow != slow:
                d.set_slow(self.now, slow)
                self._schedule_de(e)

    def _kv_owed(self, unit: StepUnit) -> float:
        """CPU seconds the storage paths of the unit's nodes used since the last look (the most of any node)."""
        kv = self.kvcpu
        assert kv is not None
        owed = 0.0
        for node in {e.node.nid: e.node for e in unit.engines}.values():
            got = kv.take(node.nid, node.snic_r, node.snic_w, self.now)
            owed = got if got > owed else owed
        return owed

    def _kv_stall(self, e: Engine) -> None:
        """A decode batch stands still for the CPU its node's storage path used since its last event."""
        kv, d, node = self.kvcpu, e.decode, e.node
        assert kv is not None and d is not None
        owed = kv.take(node.nid, node.snic_r, node.snic_w, self.now)
        if owed and d.n:
            d.stall(self.now, owed)

    def _step_end(self, unit: StepUnit) -> None:
        if self.kvcpu is not None:
            owed = self._kv_owed(unit)
            if owed:  # the node's storage path took the engine's core for that long during the step
                unit.busy_s += owed
                self.push(self.now + owed, self._step_end, unit)
                return
        now, kvb = self.now, self.kvb
        for e, reqs, chunks in unit.batch:
            gone = False
            for r, c in zip(reqs, chunks):
                r.done += c.bsz
                if r.done < r.miss:
                    continue
                gone = True
                r.t_first = now
                if self.judge is not None:
                    self.judge.first_token(r.t_arrive, now - r.t_arrive)
                self.sched.prefill_done(r)
                if self.oracle:
                    self.push(now, self._join, r)
                    continue
                pd_end = stage_end(unit.t_start, C_PD, r, kvb)
                if pd_end > now:  # the copy into HBM is booked once the prompt's KV is all there
                    self.push(pd_end, self._h2d, r)
                else:
                    self._h2d(r)
            if gone:
                e.queue = [r for r in e.queue if r.done < r.miss]
        unit.batch = []
        unit.busy = False
        if self.sched.pending():
            self._arm_tick()
        self._kick(unit)
        if self.pool is not None and not unit.busy:
            self._pool_update()

    def _persist(self, r: Req, first: int, end: int) -> None:
        """Tokens [first, end) of `r` written through its decode node's storage NIC from now."""
        assert self.lag is not None and r.de is not None
        if end <= first:
            return
        snic = r.de.snic_w
        t0 = max(self.now, snic.free_at)
        book(self.now, C_PERSIST, r, 0, 0, (end - first) * self.kvb)
        self.lag.wrote(r.agent, t0, snic.free_at, first, end)

    def _h2d(self, r: Req) -> None:
        """The prompt's KV is in the decode node's buffer: its copy into HBM is booked from now, so a link
        is not held idle for a copy that cannot start yet."""
        self.push(book(self.now, C_H2D, r, r.hit * self.kvb, r.miss * self.kvb), self._join, r)

    def _join(self, r: Req) -> None:
        r.t_join = self.now
        if self.lag is not None:  # the decode engine writes the prompt's blocks the store lacks at once
            self._persist(r, r.hit, r.prompt // self.w.block * self.w.block)
        if r.gen <= 1:
            self._finish(r)
            return
        assert r.de is not None and r.de.decode is not None
        d = r.de.decode
        if self.kvcpu is not None:
            self._kv_stall(r.de)
        d.join(self.now, r.rid, r, r.prompt, r.gen - 1)
        r.t_second = max(self.now, d.t_last) + d.step_s
        self._schedule_de(r.de)
        if self.pool is not None:
            self._pool_update()

    def _schedule_de(self, e: Engine) -> None:
        d = e.decode
        assert d is not None
        if d.n:
            self.push(d.next_finish(), self._de_finish, (e, d.version))

    def _de_finish(self, arg: tuple[Engine, int]) -> None:
        e, version = arg
        d = e.decode
        assert d is not None
        if version != d.version:
            return
        if self.kvcpu is not None:
            self._kv_stall(e)
        for r in d.pop_finished(self.now):
            self._finish(r)
        self._schedule_de(e)
        if self.pool is not None:
            self._pool_update()

    def _finish(self, r: Req) -> None:
        now = self.now
        self.sched.finished(r)
        if self.lag is not None:  # the blocks decode filled (the prompt's went at its join)
            b = self.w.block
            self._persist(r, max(r.hit, r.prompt // b * b), (r.prompt + r.gen) // b * b)
        elif not self.oracle:
            book(now, C_PERSIST, r, 0, 0, (r.miss + r.gen) * self.kvb)
        self.t_arrive.append(r.t_arrive)
        self.ttft.append(r.t_first - r.t_arrive)
        if self.after_tool.pop(r.rid, False):
            self.ttft_after_tool.append((self.pf is not None and self.pf.hinted(r.agent), r.t_first - r.t_arrive))
        if r.gen > 1:
            tpot = (now - r.t_join) / (r.gen - 1)
            self.tpot.append(tpot)
            self.ttst.append(r.t_second - r.t_arrive)
            if self.judge is not None:
                self.judge.finished(now, tpot)
        self.finished += 1
        if self.bar is not None and self.finished % 5000 == 0:
            self.bar.update(self.finished - self.bar.n)
        a = r.agent
        self.ctx[a] = r.prompt + r.gen
        self.turn[a] += 1
        if self.turn[a] < self.w.n_turns(a):
            tool = self.w.tool_after(a, self.turn[a] - 1)
            if self.pf is not None:
                self.pf.turn_done(a, self.ctx[a], tool)
            if self.think_s + tool > 0:
                self.push(now + self.think_s + tool, self._arrive, a)
            else:
                self._arrive(a)
        else:
            self.agents_done += 1
            self.end_t = now
        if self.sched.pending():
            self._arm_tick()


def run_sim(cfg: SimConfig, model: SimModel | None = None, workload: SimWorkload | None = None) -> SimResult:
    return Simulation(cfg, model, workload).run()
