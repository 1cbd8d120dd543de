"""First-come, first-served waiting for DRAM-buffer slots.

Decides only who may take slots as they free up: waiters in arrival order, best-effort work only
`spare()` slots. Allocation itself is `SlotAllocator`'s."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from shared.kv.allocator import OutOfSlots, SlotAllocator


class SlotWaitExpired(OutOfSlots):
    """No room within the wait's deadline (an OutOfSlots)."""


class WaitLine:
    def __init__(self, slots: SlotAllocator) -> None:
        self.slots = slots
        self.freed = asyncio.Event()  # set whenever slots are released
        self.waiters: list[tuple[str, int]] = []  # (owner, slots wanted), in arrival order

    def note_free(self) -> None:
        self.freed.set()

    def spare(self) -> int:
        return max(0, self.slots.free - sum(n for _, n in self.waiters))

    async def allocate(self, owner: str, n: int, timeout: float,
                       cancelled: Callable[[str], bool] = lambda _: False) -> list[int]:
        """`n` slots, waiting in line up to `timeout`; OutOfSlots when too many, late or cancelled."""
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
