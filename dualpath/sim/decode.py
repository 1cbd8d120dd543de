"""A decode engine's running batch, advanced in aggregate (no per-token events).

A fractional step counter advances at 1/step_s, so a request costs two events (join, finish).
A step lasts max(compute, collectives); `stall` holds the counter still.
"""
from __future__ import annotations

import heapq

from typing import Generic, TypeVar

from dualpath.sim.models import SimModel
from dualpath.sim.resources import Link

R = TypeVar("R")  # what the batch runs (the simulator's requests); only held and handed back

EPS = 1e-9


class DecodeState(Generic[R]):
    __slots__ = ("model", "links", "comm", "heap", "steps", "t_last", "step_s", "ctx_base", "capped",
                 "version", "n", "batch_s", "busy_s", "slow")

    def __init__(self, model: SimModel, links: tuple[Link, ...] = (), traffic: float = 1.0) -> None:
        self.model = model
        self.links: tuple[Link, ...] = links if traffic > 0 else ()  # the engine's CNIC, both ways
        self.comm = model.decode_comm_bytes * traffic  # CNIC bytes per token per step
        self.batch_s = 0.0  # integral of the batch size over time
        self.busy_s = 0.0  # time a batch ran, stepping or stalled (a real engine's step seconds)
        self.heap: list[tuple[float, int, R, int, float]] = []  # (finish step, rid, request, prompt, step joined)
        self.steps = 0.0
        self.t_last = 0.0
        self.step_s = 0.0
        self.ctx_base = 0.0
        self.capped = 0.0
        self.version = 0
        self.n = 0
        self.slow = 1.0  # compute stretch: the engine shares its cores (dualpath/sim/hostcpu.py)

    def advance(self, now: float) -> None:
        if now < self.t_last:  # stalled (`stall`) until t_last: no progress yet
            return
        if self.n:
            self.steps += (now - self.t_last) / self.step_s
            self.batch_s += self.n * (now - self.t_last)
            self.busy_s += now - self.t_last
        self.t_last = now

    def stall(self, now: float, secs: float) -> None:
        """The running batch makes no progress for `secs` from `now`; the caller reschedules its finish."""
        self.advance(now)
        if self.n and secs > 0:
            self.batch_s += self.n * secs
            self.busy_s += secs
            self.t_last += secs
            self.version += 1

    def join(self, now: float, rid: int, req: R, prompt: int, todo: int) -> None:
        """Add a request with `todo` tokens left to generate (todo >= 1)."""
        self.advance(now)
        self.n += 1
        self.ctx_base += prompt + 1 - self.steps
        topk = self.model.topk
        if topk:
            self.capped += min(prompt, topk)
        heapq.heappush(self.heap, (self.steps + todo, rid, req, prompt, self.steps))
        self._retime()

    def pop_finished(self, now: float) -> list[R]:
        """Requests whose last token is out by `now` (advances the clock)."""
        self.advance(now)
        out = []
        heap = self.heap
        topk = self.model.topk
        while heap and heap[0][0] <= self.steps + EPS:
            _, _, req, prompt, joined = heapq.heappop(heap)
            self.n -= 1
            self.ctx_base -= prompt + 1 - joined
            if topk:
                self.capped -= min(prompt, topk)
            out.append(req)
        if out:
            if not self.n:
                self.ctx_base = self.capped = 0.0  # drop accumulated float error
            self._retime()
        return out

    def set_slow(self, now: float, slow: float) -> None:
        """From `now` on, each step's compute takes `slow` times as long (the caller reschedules)."""
        self.advance(now)
        if slow != self.slow:
            self.slow = slow
            self._retime()

    def _retime(self) -> None:
        self.version += 1
        n = self.n
        if not n:
            self.step_s = 0.0
            for link in self.links:
                link.set_model(self.t_last, 0.0)
            return
        ctx = self.ctx_base + n * self.steps
        step = self.model.decode_compute_s(n, ctx, self.capped) * self.slow
        if self.comm and self.links:
            nbytes = n * self.comm
            now = self.t_last
            out, into = self.links
            a, b = out.model_burst(now, nbytes), into.model_burst(now, nbytes)
            comm = self.model.comm_latency_s + (a if a > b else b)
            step = comm if comm > step else step
            u = nbytes / (out.bw * step)
            out.set_model(now, u if u < 1.0 else 1.0)
            into.set_model(now, u if u < 1.0 else 1.0)
        self.step_s = step

    def next_finish(self) -> float:
        if not self.heap:
            return float("inf")
        return self.t_last + max(0.0, self.heap[0][0] - self.steps) * self.step_s
