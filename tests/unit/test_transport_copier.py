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


@pytest.mark.parametrize("caller_copies", [True, False])
@pytest.mark.parametrize("cls", [L, B])
def test_scattered_and_long_pairs_land_exactly(cls, caller_copies):
    async def main():
        w = CopyWorker(DEFAULT_WEIGHTS, caller_copies=caller_copies)
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
    between two bulk pieces. (The worker alone here: the calling thread's own share of a bulk
    transfer is tested below.)"""
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
        w = CopyWorker(DEFAULT_WEIGHTS, caller_copies=False)
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


def _scattered(n: int, piece: int = 96 << 10):
    src = memoryview(os.urandom(n * piece))
    dst = memoryview(bytearray(len(src)))
    order = list(reversed(range(n)))
    pairs = [(dst[j * piece:(j + 1) * piece], src[i * piece:(i + 1) * piece]) for i, j in enumerate(order)]

    def landed() -> bool:
        return all(dst[j * piece:(j + 1) * piece] == src[i * piece:(i + 1) * piece] for i, j in enumerate(order))

    return pairs, src, landed


def _trace(monkeypatch, hook=None) -> list[tuple[int, str]]:
    """Record (thread id, "L"/"B") of every copied piece; latency pieces are 4 KiB here."""
    import shared.transport.copier as copier

    seen: list[tuple[int, str]] = []
    real = copier.copy_pair

    def traced(dst, src) -> None:
        seen.append((threading.get_ident(), "L" if len(dst) == 4096 else "B"))
        if hook is not None:
            hook(seen)
        real(dst, src)

    monkeypatch.setattr(copier, "copy_pair", traced)
    return seen


def test_the_calling_thread_copies_a_bulk_transfer_itself_while_it_serves_no_latency(monkeypatch):
    """No latency work: the caller copies every piece (bytes exact) and returns with no hand-off
    to the worker or back; the worker thread copied nothing."""
    seen = _trace(monkeypatch)

    async def main():
        w = CopyWorker(DEFAULT_WEIGHTS)
        try:
            pairs, _, landed = _scattered(40)
            await w.copy(pairs, B)
            assert landed()
        finally:
            w.close()

    asyncio.run(main())
    me = threading.get_ident()
    assert len(seen) == 40 and {t for t, _ in seen} == {me}


def test_a_busy_loop_enlists_the_worker_and_both_threads_land_exact_bytes(monkeypatch):
    """Other tasks take loop time: the worker joins from the back (here the caller blocks in a
    piece of its second turn until the worker has copied one); every piece lands exactly once."""
    import shared.transport.copier as copier

    monkeypatch.setattr(copier, "LOOP_BUSY", 0.0)  # any turn counts as busy: enlist at the first
    first_turn = -(-copier.LOOP_TURN // (96 << 10))  # pieces the caller copies before it yields
    n = first_turn + 40
    worker_copied = threading.Event()
    me = threading.get_ident()

    def hook(seen):
        if seen[-1][0] != me:
            worker_copied.set()
        elif len(seen) > first_turn:  # the caller, past its first turn: let the worker take some pieces
            worker_copied.wait()  # (a worker that never joins hangs here: the suite's timeout reports it)

    seen = _trace(monkeypatch, hook)

    async def main():
        w = CopyWorker(DEFAULT_WEIGHTS)
        try:
            pairs, _, landed = _scattered(n)
            await w.copy(pairs, B)
            assert landed()
        finally:
            w.close()

    asyncio.run(main())
    assert len(seen) == n and len({t for t, _ in seen}) == 2  # both threads copied


def test_a_latency_copy_cuts_in_between_the_callers_bulk_pieces_and_the_worker_takes_the_rest(monkeypatch):
    """The caller yields to its loop every LOOP_TURN bytes: a latency copy issued meanwhile runs
    at the first yield (inline), and from then on the caller leaves the bulk to the worker."""
    from shared.transport.copier import LOOP_TURN

    seen = _trace(monkeypatch)
    n = 64

    async def main():
        w = CopyWorker(DEFAULT_WEIGHTS)
        try:
            pairs, _, landed = _scattered(n)
            lsrc, ldst = memoryview(os.urandom(4096)), memoryview(bytearray(4096))
            lat = asyncio.ensure_future(w.copy([(ldst, lsrc)], L))  # runs at the loop's next turn
            await w.copy(pairs, B)
            assert lat.done() and ldst == lsrc and landed()
        finally:
            w.close()

    asyncio.run(main())
    me = threading.get_ident()
    kinds = [k for _, k in seen]
    first_turn = -(-LOOP_TURN // (96 << 10))  # pieces the caller copies before it yields
    assert kinds.count("B") == n and kinds.index("L") == first_turn, kinds
    after = [t for t, k in seen[first_turn + 1:]]
    assert after and me not in after  # the rest was the worker's


def test_a_cancelled_shared_copy_stops_and_the_worker_keeps_going(monkeypatch):
    async def main():
        w = CopyWorker(DEFAULT_WEIGHTS)
        try:
            pairs, _, _ = _scattered(64)
            task = asyncio.ensure_future(w.copy(pairs, B))
            await asyncio.sleep(0)  # the caller copies its first turn and yields
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            pairs, _, landed = _scattered(8)
            await w.copy(pairs, B)
            assert landed()
        finally:
            w.close()

    asyncio.run(main())
