"""A synthetic front door: a front-door worker's messages to the dispatch core, at any rate, no HTTP.

Sends `Submit`s at Poisson arrivals and answers each `Forward` with `PrefillOver` and `Done`
timed by `FleetTiming`, so the core holds the paper's load; measures Submit-to-Forward time.
"""
from __future__ import annotations

import asyncio
import gc
import heapq
import itertools
import os
import time

import numpy as np

from shared.bus import Bus, Delivery
from shared.messages.endpoints import EP
from shared.messages.front import Done, Forward, PrefillOver, Submit
from shared.messages.subjects import Subjects
from shared.messages.work import Sampling

TICK_S = 0.002
WAIT = "dualpath_scheduler_assign_wait_seconds"  # the core's own: a Submit's receipt to its Forward sent
KEY_BYTES = 16


class SyntheticFront:
    def __init__(self, bus: Bus, subjects: Subjects, core: str, trajectories, timing, block: int,
                 rate: float, seed: int = 0):
        self.bus, self.timing, self.block, self.rate = bus, timing, block, rate
        self.front = subjects.at(EP.SCHED_FRONT, scheduler=core)
        self.reply = subjects.at(EP.SCHED_OUT, scheduler=f"{core}-synthetic")
        self.forwards = subjects.at(EP.SCHED_FORWARD, scheduler=f"{core}-synthetic")
        self.rng = np.random.default_rng([seed, 11])
        self.turns = [(ctx - a - g, a, g) for t in trajectories  # (context before, append, gen) of every turn
                      for ctx, (a, g) in zip(itertools.accumulate(a + g for a, g in t.turns), t.turns)]
        self.sent: dict[str, tuple[float, int, int, int]] = {}  # req_id -> (sent at, hit tokens, new, gen)
        self.assigned: list[tuple[float, float]] = []  # (sent at, seconds from Submit to Forward)
        self.later: list[tuple[float, int, object]] = []  # (due, order, message) heap
        self.n = self.finished = 0  # submitted, done

    async def start(self) -> None:
        await self.bus.subscribe(self.forwards, self._on_work)

    def in_flight(self) -> int:
        """Requests submitted and not done (waiting for their placement, or running)."""
        return self.n - self.finished

    async def _release(self, now: float) -> None:
        while self.later and self.later[0][0] <= now:
            msg = heapq.heappop(self.later)[2]
            self.finished += isinstance(msg, Done)
            await self.bus.publish(self.front, msg)

    async def run(self, seconds: float) -> None:
        """Submit at `rate` for `seconds`; due `PrefillOver` / `Done` messages go out every tick."""
        t0 = time.monotonic()
        due = t0 + self.rng.exponential(1.0 / self.rate)
        while (now := time.monotonic()) < t0 + seconds:
            while due <= now:
                await self._submit(now)
                due += self.rng.exponential(1.0 / self.rate)
            await self._release(now)
            await asyncio.sleep(TICK_S)

    async def drain(self, timeout: float) -> None:
        """Keep answering until every request was placed and finished (or `timeout`)."""
        end = time.monotonic() + timeout
        while (self.sent or self.later) and time.monotonic() < end:
            await self._release(time.monotonic())
            await asyncio.sleep(TICK_S)

    async def _submit(self, now: float) -> None:
        ctx, append, gen = self.turns[int(self.rng.integers(len(self.turns)))]
        prompt = ctx + append
        n_keys = prompt // self.block
        keys = os.urandom(n_keys * KEY_BYTES)  # packed end to end, as a worker sends them
        stored = min(ctx // self.block, max(0, (prompt - 1) // self.block))
        rid = f"s{self.n}"
        self.n += 1
        self.sent[rid] = (now, stored * self.block, prompt - stored * self.block, gen)
        await self.bus.publish(self.front, Submit(rid, self.reply, Sampling(max_tokens=gen), prompt_tokens=prompt,
                                                  block_keys=keys, stored_blocks=stored))

    async def _on_work(self, msg: Forward, d: Delivery) -> None:
        rid = msg.work.req_id.partition("#")[0]
        got = self.sent.pop(rid, None)
        if got is None:
            return
        now = time.monotonic()
        sent, hit, new, gen = got
        self.assigned.append((sent, now - sent))
        t = self.timing
        first = now + t.read_s(hit) + t.prefill_s([(hit, new)])
        step = t.decode_step_s(16, 16 * (hit + new + gen), 16 * t.capped(hit + new + gen))
        self._later(first, PrefillOver(rid))
        self._later(first + t.transfer_s(hit + new) + max(0, gen - 1) * step, Done(rid, "ok", list(range(gen))))

    def _later(self, due: float, msg) -> None:
        heapq.heappush(self.later, (due, id(msg), msg))


async def core_name(bus: Bus, subjects: Subjects, timeout: float = 30.0) -> str:
    """The dispatch core's instance: the scheduler announcing into the registry (not its workers)."""
    from shared.messages.registry import Announce, SchedulerAnnounce
    found: asyncio.Future = asyncio.get_running_loop().create_future()

    async def on(msg, d: Delivery) -> None:
        if isinstance(msg, SchedulerAnnounce) and not found.done():
            found.set_result(msg.instance)
    sub = await bus.subscribe(subjects.at(EP.HEARTBEAT), on)
    try:
        return await asyncio.wait_for(found, timeout)
    finally:
        await sub.unsubscribe()


async def drive_core(fleet, rate: float | None = None) -> dict:
    """One run of `fleet` driven at `rate` requests/s (None: its spec's load); the core's figures."""
    from dualpath.fleet.driver import PER_NODE, hist_quantile, histogram, paper_rate, percentile
    from dualpath.traces import trace_stats
    from dualpath.fleet.group import fleet_layout
    from dualpath.fleet.timing import FleetTiming

    s = fleet.spec
    idle = await fleet.idle_cost()
    bus = await Bus.connect(fleet.nats_url, "fleet-front", wait_s=10)
    subjects = Subjects(fleet.ns)
    timing = FleetTiming.build(s.model, s.hardware, s.nodes[1] * PER_NODE, scale=s.time_scale)
    trajs = fleet.trajectories()
    rate = rate or paper_rate(s, trace_stats(trajs))[1]
    front = SyntheticFront(bus, subjects, await core_name(bus, subjects), trajs, timing,
                           fleet_layout(s.model).block_size, rate, s.seed)
    await front.start()
    gc.disable()  # this process's own collections would stall its answers and count as the core's latency
    try:
        await front.run(s.warmup_s)
        a = await asyncio.to_thread(fleet.snapshot)
        n0 = front.n
        await front.run(s.measure_s)
        b = await asyncio.to_thread(fleet.snapshot)
        held, waiting = front.in_flight(), len(front.sent)
        await front.drain(60.0)
    finally:
        gc.enable()
        await bus.close()
    wall = b["t"] - a["t"]
    window = [lat for sent, lat in front.assigned if a["t"] <= sent < b["t"]]
    cpu = {n: b["cpu"][n] - a["cpu"].get(n, 0.0) for n in b["cpu"]}
    n = max(1, len(window))
    return {
        "engines": s.engines, "target_rate": rate, "idle_cores": idle, "wall_s": wall,
        "submitted_per_s": (front.n - n0) / wall, "assign_per_s": len(window) / wall,
        "in_flight": held, "waiting": waiting, "never_assigned": len(front.sent),
        "assign_p50_ms": percentile(window, 0.5) * 1e3, "assign_p99_ms": percentile(window, 0.99) * 1e3,
        "assign_max_ms": max(window, default=float("nan")) * 1e3,
        **{f"core_wait_p{q}_ms": hist_quantile(histogram(a["metrics"], WAIT), histogram(b["metrics"], WAIT),
                                                q / 100) * 1e3 for q in (50, 99)},
        "core_cores": cpu["scheduler"] / wall, "core_ms_per_req": cpu["scheduler"] / n * 1e3,
        "core_net_ms_per_req": (cpu["scheduler"] - idle * wall) / n * 1e3,
        "core_in_msgs_per_s": (b["sched_in"] - a["sched_in"]) / wall,
        "core_out_msgs_per_s": (b["sched_out"] - a["sched_out"]) / wall,
        "nats_cores": cpu["nats"] / wall, "driver_cores": (b["self_cpu"] - a["self_cpu"]) / wall,
        "emulator_cores": sum(v for k, v in cpu.items() if k.startswith("group")) / wall,
        "loadavg": (a["load"] + b["load"]) / 2,
    }
