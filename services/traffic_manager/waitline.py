"""First-come, first-served waiting for DRAM-buffer slots.

Owns the line of requests waiting for buffer room in one traffic-manager. Allocation
itself is `SlotAllocator`'s (shared/kv/allocator.py); this only decides who may take
slots when they free up:
  - waiters are served in arrival order: a large request is not starved by smaller ones
    taking every slot the moment it frees;
  - best-effort work that never waits (persistence copies) takes only `spare()` slots,
    those no waiter needs.
Example: 10 slots, 8 used. A waits for 4, B for 1 (behind A). Two slots free: B does not
jump ahead of A; spare() is 0, so a persistence copy takes none. Two more free: A gets 4.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from shared.kv.allocator import OutOfSlots, SlotAllocator


class SlotWaitExpired(OutOfSlots):
    """No room within the wait's deadline (an OutOfSlots: callers that catch one catch this)."""


class WaitLine:
    def __init__(self, slots: SlotAllocator) -> None:
        self.slots = slots
        self.freed = asyncio.Event()  # set whenever slots are released
        self.waiters: list[tuple[str, int]] = []  # (owner, slots wanted), in arrival order

    def note_free(self) -> None:
        self.freed.set()

    def spare(self) -> int:
        """Free slots nobody in line is waiting for."""
        return max(0, self.slots.free - sum(n for _, n in self.waiters))

    async def allocate(self, owner: str, n: int, timeout: float,
                       cancelled: Callable[[str], bool] = lambda _: False) -> list[int]:
        """`n` slots for `owner`, waiting in line up to `timeout` seconds.

        Raises OutOfSlots when `n` exceeds the buffer, the wait times out, or `cancelled(owner)`
        turns true while waiting (a cancelled request never holds slots).
        """
        if n > self.slots.n_slots:
            raise OutOfSlots(n, self.slots.n_slots)
        deadline = time.monotonic() + timeout
        ticket = (owner, n)
        self.waiters.append(ticket)
        try:
            while True:
                if cancelled(owner):
                    raise OutOfSlots(n, 0)
                if self.waiters[0] is ticket and self.slots.can_allocate(n):
                    return self.slots.allocate(owner, n)
                left = deadline - time.monotonic()
                if left <= 0:
                    raise SlotWaitExpired(n, self.slots.free)
                self.freed.clear()
                try:
                    await asyncio.wait_for(self.freed.wait(), left)
                except asyncio.TimeoutError:
                    pass
        finally:
            self.waiters = [t for t in self.waiters if t is not ticket]
            self.freed.set()  # the next in line re-checks
