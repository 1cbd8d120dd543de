"""Traffic-class scheduling (DRR over bytes): weights, work conservation, no starvation."""

import asyncio

import pytest

from shared.transport.classes import BULK_CHUNK, CHUNK, ClassSender, DrrScheduler, chunk_for, split

pytestmark = pytest.mark.unit
L, B = 0, 1


def drain(s: DrrScheduler[int]) -> list[int]:
    out = []
    while (got := s.pop()) is not None:
        out.append(got[0])
    return out


def test_split_cuts_into_chunks_that_cover_the_range():
    assert split(10, 5, 4) == [(10, 4), (14, 1)]
    assert split(0, 3 * CHUNK) == [(0, CHUNK), (CHUNK, CHUNK), (2 * CHUNK, CHUNK)]
    assert split(7, 0) == [(7, 0)]


@pytest.mark.parametrize("weights", [(99, 1), (3, 1), (1, 1)])
def test_backlogged_classes_share_bytes_by_weight(weights):
    s: DrrScheduler[int] = DrrScheduler(weights, quantum=CHUNK)
    for i in range(20000):
        s.push(L, i, CHUNK)
        s.push(B, i, CHUNK)
    served = [s.pop()[0] for _ in range(10000)]  # type: ignore[index]
    share = served.count(L) / len(served)
    assert share == pytest.approx(weights[0] / sum(weights), abs=0.02)


def test_work_conserving_bulk_alone_gets_every_slot():
    s: DrrScheduler[int] = DrrScheduler((99, 1))
    for i in range(50):
        s.push(B, i, CHUNK)
    assert drain(s) == [B] * 50


def test_latency_overtakes_a_long_bulk_queue_within_one_chunk():
    s: DrrScheduler[int] = DrrScheduler((99, 1))
    for i in range(100):
        s.push(B, i, CHUNK)
    assert s.pop() == (B, 0)
    s.push(L, 999, 4096)
    assert s.pop() == (L, 999)


def test_bulk_is_not_starved_by_saturating_latency():
    s: DrrScheduler[int] = DrrScheduler((99, 1))
    for i in range(1000):
        s.push(L, i, CHUNK)
    s.push(B, -1, CHUNK)
    order = drain(s)
    assert order.index(B) <= 100


def test_items_larger_than_a_quantum_are_still_served():
    s: DrrScheduler[int] = DrrScheduler((1, 1), quantum=10)
    s.push(L, 1, 35)
    s.push(B, 2, 5)
    assert sorted(drain(s)) == [L, B]


def test_pop_batch_respects_byte_budget_and_order():
    s: DrrScheduler[int] = DrrScheduler((99, 1))
    for i in range(10):
        s.push(L, i, 100)
    batch = s.pop_batch(350)
    assert [item for _, item in batch] == [0, 1, 2]
    assert len(s) == 7
    s2: DrrScheduler[int] = DrrScheduler()
    s2.push(B, 0, 10**9)
    assert len(s2.pop_batch(1)) == 1  # an oversized item still goes alone


def test_weights_must_be_positive():
    with pytest.raises(ValueError):
        DrrScheduler((1, 0))


def test_class_sender_emits_batches_in_drr_order():
    async def main() -> list[list[str]]:
        seen: list[list[str]] = []

        async def emit(batch: list[str]) -> None:
            seen.append(batch)
            await asyncio.sleep(0)

        sender: ClassSender[str] = ClassSender(emit, (99, 1), batch_bytes=2 * CHUNK)
        for i in range(4):
            sender.submit(B, f"b{i}", CHUNK)
        task = asyncio.get_running_loop().create_task(sender.run())
        await asyncio.sleep(0)
        sender.submit(L, "l0", CHUNK)
        for _ in range(10):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return seen

    seen = asyncio.run(main())
    flat = [x for b in seen for x in b]
    assert sorted(flat) == ["b0", "b1", "b2", "b3", "l0"]
    assert all(len(b) <= 2 for b in seen)
    assert flat.index("l0") <= 3  # overtook the queued bulk after at most one batch


def test_bulk_moves_in_small_batches_latency_in_large_ones():
    """A bulk-only batch holds at most BULK_CHUNK bytes (a latency frame submitted meanwhile
    waits for at most that); latency packs up to batch_bytes."""
    assert chunk_for(L) == CHUNK and chunk_for(B) == BULK_CHUNK < CHUNK

    async def main() -> list[list[str]]:
        seen: list[list[str]] = []

        async def emit(batch: list[str]) -> None:
            seen.append(batch)
            await asyncio.sleep(0)

        sender: ClassSender[str] = ClassSender(emit, (99, 1), batch_bytes=CHUNK)
        task = asyncio.get_running_loop().create_task(sender.run())
        for cls, name, size in ((B, "b", BULK_CHUNK // 2), (L, "l", CHUNK // 4)):
            for i in range(4):
                sender.submit(cls, f"{name}{i}", size)
            for _ in range(10):
                await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return seen

    assert asyncio.run(main()) == [["b0", "b1"], ["b2", "b3"], ["l0", "l1", "l2", "l3"]]


def test_an_idle_sender_sends_latency_at_once_and_queues_what_the_link_did_not_take_first():
    """send_now takes a latency item on the spot only while nothing is queued or mid-send;
    a part the link did not take goes out before anything submitted after it."""
    async def main() -> tuple[list[str], list[str]]:
        now: list[str] = []
        emitted: list[str] = []
        room = [1]  # items the "socket" takes at once

        def send_now(item: str) -> str | None:
            if room[0] > 0:
                room[0] -= 1
                now.append(item)
                return None
            return item + "-rest"

        async def emit(batch: list[str]) -> None:
            emitted.extend(batch)
            await asyncio.sleep(0)

        sender: ClassSender[str] = ClassSender(emit, (99, 1), send_now=send_now)
        task = asyncio.get_running_loop().create_task(sender.run())
        sender.submit(L, "a", 10)  # idle: sent at once
        sender.submit(L, "b", 10)  # the link is full: its rest is queued first in line
        sender.submit(L, "c", 10)  # something is queued: no jumping ahead
        sender.submit(B, "x", 10)  # bulk never goes through send_now
        for _ in range(10):
            await asyncio.sleep(0)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return now, emitted

    now, emitted = asyncio.run(main())
    assert now == ["a"]
    assert [x for x in emitted if x != "x"] == ["b-rest", "c"] and "x" in emitted


def test_coalesce_merges_runs_that_continue_on_both_sides_and_keeps_order():
    from shared.transport.base import Op, coalesce

    ops = [Op("kv", 0, "buf", 0, 8), Op("kv", 8, "buf", 8, 8), Op("kv", 16, "buf", 32, 8),  # dst jumps
           Op("kv", 24, "buf", 40, 8), Op("x", 32, "buf", 48, 8), Op("x", 40, "buf", 56, 4)]
    assert coalesce(ops) == [Op("kv", 0, "buf", 0, 16), Op("kv", 16, "buf", 32, 16), Op("x", 32, "buf", 48, 12)]
    assert coalesce([]) == [] and coalesce(ops[2:3]) == ops[2:3]
    backwards = [Op("kv", 8, "buf", 8, 8), Op("kv", 0, "buf", 0, 8)]
    assert coalesce(backwards) == backwards
