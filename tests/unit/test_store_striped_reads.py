"""GatewayCore reads spread over free I/O threads: every block lands, a miss still
ends the verified prefix, busy slots are not taken, overlapping slots are refused,
and a cancellation stops every stripe after its current block."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pytest

from services.storage_gateway.engine import GatewayCore
from shared.kv.full_block import HEADER_SIZE
from tests.unit.store_util import PAYLOAD, fill, make_keys, make_store, payload_for

pytestmark = pytest.mark.unit

HANG_GUARD_S = 60.0  # only a guard against a hung test, never a timing assertion


def _core(root: Path, io_threads: int) -> GatewayCore:
    # stripe_min_bytes=1: the tests' 8 KiB blocks spread like 8 MiB ones would
    return GatewayCore(make_store(root), io_threads=io_threads, stripe_min_bytes=1)


def _record_stripes(core: GatewayCore) -> list[tuple[int, int]]:
    """Wrap the core's per-thread reader; returns the (first, step) of each stripe."""
    seen: list[tuple[int, int]] = []
    original = core._read_chain

    def wrapped(keys: Sequence[bytes], slots: object, chain: object, first: int = 0,
                step: int = 1) -> None:  # fmt: skip
        seen.append((first, step))
        original(keys, slots, chain, first, step)  # type: ignore[arg-type]

    core._read_chain = wrapped  # type: ignore[method-assign]
    return seen


def test_a_request_spreads_over_free_threads_and_every_block_lands(tmp_path: Path) -> None:
    core = _core(tmp_path, io_threads=3)
    stripes = _record_stripes(core)
    keys = make_keys(7)
    fill(core.store, keys)
    buf = np.zeros(8 * PAYLOAD, np.uint8)
    offsets = [7 * PAYLOAD, 0, 3 * PAYLOAD, PAYLOAD, 6 * PAYLOAD, 2 * PAYLOAD, 5 * PAYLOAD]
    result = asyncio.run(core.read_blocks(keys, memoryview(buf), offsets))
    assert sorted(stripes) == [(0, 3), (1, 3), (2, 3)]
    assert (result.blocks, result.bytes, result.stop_key) == (7, 7 * PAYLOAD, None)
    for key, off in zip(keys, offsets, strict=True):
        assert np.array_equal(buf[off : off + PAYLOAD], payload_for(key))
    assert not buf[4 * PAYLOAD : 5 * PAYLOAD].any()  # the one slot no key was sent to
    assert core.store.stats().blocks_read == 7
    core.check_integrity()
    core.close()


def test_small_requests_stay_on_one_thread(tmp_path: Path) -> None:
    core = GatewayCore(make_store(tmp_path), io_threads=4, stripe_min_bytes=3 * PAYLOAD)
    stripes = _record_stripes(core)
    keys = make_keys(5)
    fill(core.store, keys)
    buf = memoryview(np.zeros(5 * PAYLOAD, np.uint8))
    asyncio.run(core.read_blocks(keys[:3], buf, [0, PAYLOAD, 2 * PAYLOAD]))
    assert stripes == [(0, 1)]  # 3 blocks = one stripe's worth
    stripes.clear()
    asyncio.run(core.read_blocks(keys, buf, [i * PAYLOAD for i in range(5)]))
    assert sorted(stripes) == [(0, 2), (1, 2)]
    core.close()


def test_a_miss_under_stripes_reports_only_the_verified_prefix(tmp_path: Path) -> None:
    core = _core(tmp_path, io_threads=2)
    keys = make_keys(9)
    fill(core.store, keys[:4] + keys[5:])  # block 4 never written ...
    with open(core.store.path_for(keys[6]), "r+b") as f:  # ... and block 6 corrupt
        f.seek(HEADER_SIZE + 11)
        f.write(b"\x00\xff")
    buf = np.zeros(9 * PAYLOAD, np.uint8)
    result = asyncio.run(core.read_blocks(keys, memoryview(buf), [i * PAYLOAD for i in range(9)]))
    assert (result.blocks, result.stop_key, result.stop_reason) == (4, keys[4], "missing")
    for i in range(4):
        assert np.array_equal(buf[i * PAYLOAD : (i + 1) * PAYLOAD], payload_for(keys[i]))
    assert core.queue_snapshot().pending_blocks == 0
    core.check_integrity()
    core.close()


def test_a_request_takes_only_slots_that_are_free(tmp_path: Path) -> None:
    core = _core(tmp_path, io_threads=2)
    keys = make_keys(3)
    fill(core.store, keys)
    held, inside = threading.Event(), threading.Event()
    original = core.store.read_into

    def read_into(key: bytes, dest: memoryview) -> int:
        if key == keys[0]:  # the first request sits on its slot until released
            inside.set()
            assert held.wait(HANG_GUARD_S)
        return original(key, dest)

    core.store.read_into = read_into  # type: ignore[method-assign]
    stripes = _record_stripes(core)
    buf = memoryview(np.zeros(3 * PAYLOAD, np.uint8))

    async def main() -> None:
        first = asyncio.ensure_future(core.read_blocks(keys[:1], buf, [0]))
        assert await asyncio.to_thread(inside.wait, HANG_GUARD_S)
        second = await core.read_blocks(keys[1:], buf, [PAYLOAD, 2 * PAYLOAD])
        assert second.blocks == 2
        held.set()
        assert (await first).blocks == 1

    asyncio.run(main())
    assert stripes == [(0, 1), (0, 1)]  # the second request got the one free slot only
    core.close()


def test_overlapping_slots_are_refused(tmp_path: Path) -> None:
    core = _core(tmp_path, io_threads=2)
    keys = make_keys(3)
    buf = memoryview(np.zeros(3 * PAYLOAD, np.uint8))
    with pytest.raises(ValueError, match="overlap"):
        asyncio.run(core.read_blocks(keys, buf, [2 * PAYLOAD, 0, PAYLOAD + 1]))
    with pytest.raises(ValueError, match="overlap"):
        asyncio.run(core.read_blocks(keys[:2], buf, [PAYLOAD, PAYLOAD]))
    assert core.queue_snapshot().enqueued_blocks == 0
    core.close()


def test_cancel_stops_each_stripe_after_its_current_block(tmp_path: Path) -> None:
    core = _core(tmp_path, io_threads=2)
    keys = make_keys(6)
    fill(core.store, keys)
    release, entered = threading.Event(), threading.Semaphore(0)
    calls: list[bytes] = []
    original = core.store.read_into

    def read_into(key: bytes, dest: memoryview) -> int:
        calls.append(key)
        entered.release()
        assert release.wait(HANG_GUARD_S)
        return original(key, dest)

    core.store.read_into = read_into  # type: ignore[method-assign]
    buf = np.zeros(6 * PAYLOAD, np.uint8)

    async def main() -> None:
        task = asyncio.ensure_future(
            core.read_blocks(keys, memoryview(buf), [i * PAYLOAD for i in range(6)])
        )
        for _ in range(2):  # both stripes are inside their first block
            assert await asyncio.to_thread(entered.acquire, True, HANG_GUARD_S)
        task.cancel()
        for _ in range(3):  # the cancellation reaches the read ...
            await asyncio.sleep(0)
        assert not task.done()  # ... which waits for its threads
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert sorted(calls) == sorted(keys[:2])  # no stripe started another block
    for i in range(2):  # the blocks in flight finished: dest was quiet when it surfaced
        assert np.array_equal(buf[i * PAYLOAD : (i + 1) * PAYLOAD], payload_for(keys[i]))
    assert not buf[2 * PAYLOAD :].any()
    snap = core.queue_snapshot()
    assert (snap.pending_blocks, snap.pending_requests) == (0, 0)
    core.close()
