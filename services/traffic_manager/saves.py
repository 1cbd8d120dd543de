"""The bounded line of saves waiting for DRAM-buffer room: persistence waits, it never drops silently.

A save takes only spare slots, so it never delays the latency path; past `max_blocks` or `wait_s`
it is dropped, logged and counted."""
from __future__ import annotations

import asyncio
import logging
import time

from prometheus_client import Counter, Gauge

from services.traffic_manager.pool import BufferPool

log = logging.getLogger("traffic_manager.saves")


class SaveLine:
    def __init__(self, pool: BufferPool, max_blocks: int, wait_s: float, m_queued: Gauge, m_outcome: Counter):
        self.pool, self.max_blocks, self.wait_s = pool, max_blocks, wait_s
        self.m_queued, self.m_outcome = m_queued, m_outcome  # blocks waiting; saved_blocks_total{outcome}
        self.waiting: list[tuple[str, int]] = []  # (owner, blocks), in arrival order
        self.reclaim = None  # frees kept turns' slots (prefetch.reclaim, pending entries only)

    @property
    def queued(self) -> int:
        return sum(n for _, n in self.waiting)

    async def take(self, owner: str, n: int) -> list[int] | None:
        """`n` buffer slots for a save; None when the save is dropped."""
        pool = self.pool
        if pool.spare() < n and self.reclaim is not None:
            self.reclaim(n - pool.spare())  # turns' blocks kept for their next turn give way
        if not self.waiting and pool.spare() >= n:
            return pool.slots.allocate(owner, n)
        if self.queued + n > self.max_blocks or n > pool.slots.n_slots:
            self._drop("dropped_queue_full", owner, n)
            return None
        ticket = (owner, n)
        self.waiting.append(ticket)
        self.m_outcome.labels("queued").inc(n)
        self._note()
        deadline = time.monotonic() + self.wait_s
        try:
            while True:
                if self.waiting[0] is ticket and pool.spare() >= n:
                    return pool.slots.allocate(owner, n)
                left = deadline - time.monotonic()
                if left <= 0:
                    self._drop("dropped_wait", owner, n)
                    return None
                pool.line.freed.clear()
                try:
                    await asyncio.wait_for(pool.line.freed.wait(), left)
                except asyncio.TimeoutError:
                    pass
        finally:
            self.waiting = [t for t in self.waiting if t is not ticket]
            self._note()
            pool.line.freed.set()  # the next save in line re-checks

    def _drop(self, outcome: str, owner: str, n: int) -> None:
        self.m_outcome.labels(outcome).inc(n)
        log.warning("save %s of %d blocks dropped (%s): %d blocks already waiting for buffer room, %d spare slots",
                    owner, n, outcome, self.queued, self.pool.spare())

    def _note(self) -> None:
        self.m_queued.set(self.queued)
