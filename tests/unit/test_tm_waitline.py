"""Buffer-slot waiting line of a traffic-manager: first come, first served; spare slots only for best effort."""
from __future__ import annotations

import asyncio

import pytest

from services.traffic_manager.waitline import WaitLine
from shared.kv.allocator import OutOfSlots, SlotAllocator

pytestmark = pytest.mark.unit


async def _in_line(line: WaitLine, task: asyncio.Future, owner: str) -> None:
    """Yield to the loop until `owner` waits in `line` (or its task is already done)."""
    for _ in range(1000):  # each allocate() joins the line on its first step: a few yields suffice
        if task.done() or any(o == owner for o, _ in line.waiters):
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{owner} never joined the line")


def test_a_large_waiter_is_not_starved_by_smaller_ones():
    async def go():
        slots = SlotAllocator(10)
        line = WaitLine(slots)
        slots.allocate("held", 8)
        big = asyncio.ensure_future(line.allocate("big", 4, timeout=5))
        await _in_line(line, big, "big")
        small = asyncio.ensure_future(line.allocate("small", 1, timeout=5))
        await _in_line(line, small, "small")
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
        await _in_line(line, waiting, "c")
        line.note_free()
        with pytest.raises(OutOfSlots):
            await waiting
        assert line.waiters == [] and slots.held("c") == []

    asyncio.run(go())
