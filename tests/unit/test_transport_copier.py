"""The copy worker: items grouped from pairs, every byte lands, latency overtakes bulk, bad views fail one copy."""

import asyncio
import os
import threading

import pytest

from shared.transport.classes import DEFAULT_WEIGHTS
from shared.transport.copier import ITEM, LATENCY_INLINE, SLICE, CopyWorker, group

pytestmark = pytest.mark.unit
L, B = 0, 1


def test_group_keeps_order_and_cuts_long_pairs():
    bufs = [memoryview(bytearray(n)) for n in (3, 3, 3, 20)]
    items = group([(b, b) for b in bufs], size=8)
    assert [[len(d) for d, _ in it] for it in items] == [[3, 3], [3], [8], [8], [4]]
    assert group([], size=8) == []
    big = memoryview(bytearray(2 * ITEM + 5))
    assert [sum(len(d) for d, _ in it) for it in group([(big, big)])] == [ITEM, ITEM, 5]


@pytest.mark.parametrize("cls", [L, B])
def test_scattered_and_long_pairs_land_exactly(cls):
    async def main():
        w = CopyWorker(DEFAULT_WEIGHTS)
        try:
            src = memoryview(os.urandom(3 * ITEM + 12345))
            dst = memoryview(bytearray(len(src)))
            piece = 96 << 10
            n = len(src) // piece
            order = list(reversed(range(n)))  # piece i goes to slot n-1-i: nothing continues anything
            pairs = [(dst[j * piece:(j + 1) * piece], src[i * piece:(i + 1) * piece]) for i, j in enumerate(order)]
            await w.copy(pairs, cls)
            for i, j in enumerate(order):
                assert dst[j * piece:(j + 1) * piece] == src[i * piece:(i + 1) * piece]
            whole = memoryview(bytearray(len(src)))
            await w.copy([(whole, src)], cls)  # one pair longer than an item, with a ragged tail
            assert whole == src
        finally:
            w.close()

    asyncio.run(main())


@pytest.mark.parametrize("lat_bytes", [LATENCY_INLINE, LATENCY_INLINE + (1 << 20)])
def test_latency_overtakes_bulk_between_two_pieces_of_one_item(monkeypatch, lat_bytes):
    """A latency copy issued while a bulk item is mid-way runs after the bulk piece in hand, not
    after the rest of the item (the item here is 20 pieces, well under ITEM): up to
    LATENCY_INLINE on the caller's thread at once, a larger one queued and taken by the worker
    between two bulk pieces."""
    import shared.transport.copier as copier

    seen: list[str] = []
    in_piece, go = threading.Event(), threading.Event()
    lat_buf = bytearray(lat_bytes)
    real = copier.copy_pair

    def traced(dst: memoryview, src: memoryview) -> None:
        seen.append("L" if dst.obj is lat_buf else "B")
        if seen == ["B"]:  # hold the first bulk piece until the latency copy is queued
            in_piece.set()
            go.wait(30)
        real(dst, src)

    monkeypatch.setattr(copier, "copy_pair", traced)

    async def main():
        w = CopyWorker(DEFAULT_WEIGHTS)
        try:
            src, dst = memoryview(os.urandom(SLICE)), memoryview(bytearray(SLICE))
            bulk = asyncio.ensure_future(w.copy([(dst, src)] * 20, B))
            assert await asyncio.to_thread(in_piece.wait, 30)
            lsrc = memoryview(os.urandom(len(lat_buf)))
            lat = asyncio.ensure_future(w.copy([(memoryview(lat_buf), lsrc)], L))
            await asyncio.sleep(0)  # the latency copy is done or queued (copy() pushes before it waits)
            assert lat.done() == (lat_bytes <= LATENCY_INLINE)
            go.set()
            await lat
            await bulk
            assert memoryview(lat_buf) == lsrc and dst == src
        finally:
            go.set()
            w.close()

    asyncio.run(main())
    assert seen[:2] == ["B", "L"] and seen.count("B") == 20, seen


def test_a_bad_pair_fails_its_copy_and_the_worker_keeps_going():
    async def main():
        w = CopyWorker(DEFAULT_WEIGHTS)
        try:
            good = memoryview(bytearray(1 << 20))
            with pytest.raises(ValueError):
                await w.copy([(good, memoryview(bytes(1 << 19)))], B)  # lengths differ
            src = memoryview(os.urandom(1 << 20))
            await w.copy([(good, src)], B)
            assert good == src
        finally:
            w.close()

    asyncio.run(main())
