"""The traffic-manager's line of saves waiting for buffer room: saves wait, in order, within a bound;
a save past the bound or past its wait is dropped and counted, never silently."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, Counter, Gauge

from services.traffic_manager.saves import SaveLine
from services.traffic_manager.waitline import WaitLine
from shared.kv.allocator import SlotAllocator

pytestmark = pytest.mark.unit


def _line(n_slots: int, max_blocks: int, wait_s: float = 5.0):
    slots = SlotAllocator(n_slots)
    wait = WaitLine(slots)
    pool = SimpleNamespace(slots=slots, line=wait, spare=wait.spare)
    reg = CollectorRegistry()
    queued = Gauge("q", "q", registry=reg)
    outcome = Counter("o", "o", ("outcome",), registry=reg)
    return SaveLine(pool, max_blocks, wait_s, queued, outcome), slots, wait, reg


def _count(reg, outcome: str) -> float:
    return reg.get_sample_value("o_total", {"outcome": outcome}) or 0.0


async def _waiting(line: SaveLine, n: int) -> None:
    for _ in range(1000):
        if len(line.waiting) >= n:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{n} saves never waited")


def test_saves_wait_for_room_in_order_and_are_counted():
    async def go():
        line, slots, wait, reg = _line(4, max_blocks=8)
        slots.allocate("busy", 4)
        first = asyncio.ensure_future(line.take("a", 2))
        second = asyncio.ensure_future(line.take("b", 1))
        await _waiting(line, 2)
        assert not first.done() and not second.done() and line.queued == 3
        assert reg.get_sample_value("q") == 3
        slots.release("busy")
        wait.note_free()
        assert len(await first) == 2 and len(await second) == 1
        assert slots.held("a") and slots.held("b") and line.queued == 0
        assert _count(reg, "queued") == 3 and _count(reg, "dropped_queue_full") == 0
        slots.check_integrity()

    asyncio.run(go())


def test_a_save_past_the_bound_is_dropped_and_counted():
    async def go():
        line, slots, wait, reg = _line(4, max_blocks=3)
        slots.allocate("busy", 4)
        waiting = asyncio.ensure_future(line.take("a", 2))
        await _waiting(line, 1)
        assert await line.take("b", 2) is None  # 2 + 2 > 3 blocks
        assert _count(reg, "dropped_queue_full") == 2
        slots.release("busy")
        wait.note_free()
        assert len(await waiting) == 2

    asyncio.run(go())


def test_a_save_that_waits_too_long_is_dropped_and_counted():
    async def go():
        line, slots, wait, reg = _line(2, max_blocks=8, wait_s=0.05)
        slots.allocate("busy", 2)
        assert await line.take("a", 1) is None
        assert _count(reg, "dropped_wait") == 1 and line.queued == 0 and reg.get_sample_value("q") == 0

    asyncio.run(go())


def test_saves_take_only_spare_slots():
    async def go():
        line, slots, wait, reg = _line(4, max_blocks=8)
        slots.allocate("busy", 2)
        fetch = asyncio.ensure_future(wait.allocate("fetch", 3, timeout=5))  # a fetch waits for 3 of the 2 free
        for _ in range(100):
            await asyncio.sleep(0)
        save = asyncio.ensure_future(line.take("save", 1))
        await _waiting(line, 1)
        assert not save.done()  # the free slots are the fetch's to wait for
        slots.release("busy")
        wait.note_free()
        assert len(await fetch) == 3 and len(await save) == 1

    asyncio.run(go())
