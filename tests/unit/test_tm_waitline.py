"""Buffer-slot waiting line of a traffic-manager: first come, first served; spare slots only for best effort."""
from __future__ import annotations

import asyncio

import pytest

from services.traffic_manager.waitline import WaitLine
from shared.kv.allocator import OutOfSlots, SlotAllocator

pytestmark = pytest.mark.unit


def test_a_large_waiter_is_not_starved_by_smaller_ones():
    async def go():
        slots = SlotAllocator(10)
        line = WaitLine(slots)
        slots.allocate("held", 8)
        big = asyncio.ensure_future(line.allocate("big", 4, timeout=5))
        await asyncio.sleep(0)
        small = asyncio.ensure_future(line.allocate("small", 1, timeout=5))
        await asyncio.sleep(0.01)
        assert not big.done() and not small.done()  # 2 free: enough for small, but big is first
        assert line.spare() == 0  # best-effort work takes nothing the line needs
        slots.release("held")
        line.note_free()
        assert len(await big) == 4 and len(await small) == 1
        assert line.waiters == [] and line.spare() == 5
        slots.check_integrity()

    asyncio.run(go())


def test_timeout_cancel_and_oversize_raise_and_leave_the_line():
    async def go():
        slots = SlotAllocator(4)
        line = WaitLine(slots)
        with pytest.raises(OutOfSlots) as too_big:
            await line.allocate("x", 5, timeout=1)
        assert too_big.value.wanted == 5 and too_big.value.free == 4
        slots.allocate("held", 4)
        with pytest.raises(OutOfSlots):
            await line.allocate("late", 1, timeout=0.05)
        gone = {"c"}
        waiting = asyncio.ensure_future(line.allocate("c", 1, timeout=5, cancelled=lambda o: o in gone))
        await asyncio.sleep(0.01)
        line.note_free()
        with pytest.raises(OutOfSlots):
            await waiting
        assert line.waiters == [] and slots.held("c") == []

    asyncio.run(go())
