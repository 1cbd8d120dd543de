"""GatewayCore: ordered prefix reads into a shared buffer, misses stop the chain,
read-queue accounting, writes yielding to reads, cancellation safety."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path

import numpy as np
import pytest

from services.storage_gateway.bucket import TokenBucket
from services.storage_gateway.engine import GatewayCore
from services.storage_gateway.read_queue import ReadQueue
from services.storage_gateway.store import WriteOutcome
from shared.kv.full_block import HEADER_SIZE
from tests.unit.store_util import PAYLOAD, fill, make_keys, make_store, payload_for

pytestmark = pytest.mark.unit


def _core(root: Path, **kw: object) -> GatewayCore:
    return GatewayCore(make_store(root), io_threads=2, **kw)  # type: ignore[arg-type]


async def _until_queued(core: GatewayCore, requests: int = 1) -> None:
    """Yield to the loop until `requests` reads are in the core's read queue."""
    for _ in range(1000):  # a read enqueues on its first step: a few yields suffice
        if core.queue_snapshot().pending_requests >= requests:
            return
        await asyncio.sleep(0)
    raise AssertionError(f"{requests} read(s) never queued: {core.queue_snapshot()}")


def test_read_queue_accounting_and_snapshot() -> None:
    now = [0.0]
    queue = ReadQueue(clock=lambda: now[0])
    queue.enqueue(3, 300)
    now[0] = 2.0
    queue.dequeue(2, 200)
    snap = queue.snapshot()
    assert (snap.pending_blocks, snap.pending_bytes, snap.pending_requests) == (1, 100, 1)
    assert (snap.done_blocks, snap.peak_pending_bytes, snap.busy_s) == (2, 300, 2.0)
    queue.dequeue(1, 100)
    queue.finish_request()
    assert queue.idle and queue.snapshot().busy_s == 2.0
    with pytest.raises(ValueError):
        queue.dequeue(1, 1)
    queue.check_integrity()


def test_reads_land_at_the_given_offsets(tmp_path: Path) -> None:
    core = _core(tmp_path)
    keys = make_keys(4)
    fill(core.store, keys)
    buf = np.zeros(5 * PAYLOAD, np.uint8)
    offsets = [4 * PAYLOAD, 0, 2 * PAYLOAD, PAYLOAD]  # any slot order
    result = asyncio.run(core.read_blocks(keys, memoryview(buf), offsets))
    assert (result.blocks, result.bytes, result.requested) == (4, 4 * PAYLOAD, 4)
    assert result.stop_key is None and result.stop_reason is None
    for key, off in zip(keys, offsets, strict=True):
        assert np.array_equal(buf[off : off + PAYLOAD], payload_for(key))
    assert not buf[3 * PAYLOAD : 4 * PAYLOAD].any()
    snap = core.queue_snapshot()
    assert (snap.pending_blocks, snap.done_blocks, snap.done_bytes) == (0, 4, 4 * PAYLOAD)
    core.check_integrity()
    core.close()


def test_a_missing_block_mid_chain_ends_the_prefix(tmp_path: Path) -> None:
    core = _core(tmp_path)
    keys = make_keys(6)
    fill(core.store, keys[:3] + keys[4:])  # block 3 never written
    assert core.hit_length(keys) == 3
    buf = np.zeros(6 * PAYLOAD, np.uint8)
    result = asyncio.run(core.read_blocks(keys, memoryview(buf), [i * PAYLOAD for i in range(6)]))
    assert (result.blocks, result.stop_key, result.stop_reason) == (3, keys[3], "missing")
    assert core.queue_snapshot().pending_blocks == 0
    core.check_integrity()
    core.close()


def test_a_corrupt_block_mid_chain_is_a_miss_and_removed(tmp_path: Path) -> None:
    core = _core(tmp_path)
    keys = make_keys(3)
    fill(core.store, keys)
    with open(core.store.path_for(keys[1]), "r+b") as f:
        f.seek(HEADER_SIZE + 7)
        f.write(b"\xff\x00\xff")
    buf = np.zeros(3 * PAYLOAD, np.uint8)
    result = asyncio.run(core.read_blocks(keys, memoryview(buf), [0, PAYLOAD, 2 * PAYLOAD]))
    assert result.blocks == 1 and "checksum" in (result.stop_reason or "")
    assert core.store.stats().corrupt == 1
    assert core.hit_length(keys) == 1
    core.close()


def test_hit_accounting(tmp_path: Path) -> None:
    core = _core(tmp_path)
    keys = make_keys(5)
    fill(core.store, keys[:2])
    assert core.hit_length(keys) == 2
    assert asyncio.run(core.hit_length_async(keys[:2])) == 2
    stats = core.store.stats()
    assert (stats.hit_blocks, stats.miss_blocks) == (4, 3)
    core.close()


def test_writes_yield_to_pending_reads(tmp_path: Path) -> None:
    # 4 blocks at 4 blocks/s with a one-block burst: the read takes ~0.75 s.
    read_bucket = TokenBucket(4 * PAYLOAD, PAYLOAD)
    core = _core(tmp_path, read_bucket=read_bucket, max_write_defer_s=30.0)
    keys = make_keys(5)
    fill(core.store, keys[:4])
    finished: list[str] = []

    async def read() -> None:
        buf = np.zeros(4 * PAYLOAD, np.uint8)
        await core.read_blocks(keys[:4], memoryview(buf), [i * PAYLOAD for i in range(4)])
        finished.append("read")

    async def write() -> None:
        await _until_queued(core)  # the read is queued first
        outcome = await core.write_block(keys[4], memoryview(payload_for(keys[4])))
        assert outcome is WriteOutcome.WRITTEN
        finished.append("write")

    async def main() -> None:
        async with asyncio.TaskGroup() as tg:
            tg.create_task(read())
            tg.create_task(write())

    asyncio.run(main())
    assert finished == ["read", "write"]
    assert asyncio.run(core.write_block(keys[4], memoryview(payload_for(keys[4])))) is (
        WriteOutcome.EXISTS
    )
    core.close()


def test_cancelled_read_leaves_the_queue_empty(tmp_path: Path) -> None:
    # one block per 100 s and a frozen bucket clock: the read waits for its bytes ~500 s, so only
    # a cancellation that takes effect ends it (a read that ignored it would hang the test)
    read_bucket = TokenBucket(PAYLOAD / 100, PAYLOAD, clock=lambda: 0.0)
    core = _core(tmp_path, read_bucket=read_bucket)
    keys = make_keys(6)
    fill(core.store, keys)
    buf = np.zeros(6 * PAYLOAD, np.uint8)

    async def main() -> None:
        task = asyncio.create_task(  # owned here and awaited below
            core.read_blocks(keys, memoryview(buf), [i * PAYLOAD for i in range(6)])
        )
        await _until_queued(core)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert not buf.any()  # cancelled while it waited for the bucket: no block was read
    assert read_bucket.reserve(PAYLOAD) == 0.0  # its bytes went back to the bucket
    snap = core.queue_snapshot()
    assert (snap.pending_blocks, snap.pending_requests, snap.done_blocks) == (0, 0, 6)
    core.check_integrity()
    core.close()


def test_bad_slots_are_refused(tmp_path: Path) -> None:
    core = _core(tmp_path)
    keys = make_keys(2)
    buf = memoryview(bytearray(2 * PAYLOAD))
    with pytest.raises(ValueError):
        asyncio.run(core.read_blocks(keys, buf, [0]))
    with pytest.raises(ValueError):
        asyncio.run(core.read_blocks(keys, buf, [0, PAYLOAD + 1]))
    assert core.queue_snapshot().enqueued_blocks == 0
    core.close()


def test_io_errors_are_misses_not_crashes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    core = _core(tmp_path)
    keys = make_keys(2)
    fill(core.store, keys)

    def eio(*_: object) -> int:
        raise OSError(5, os.strerror(5))

    monkeypatch.setattr(core.store, "read_into", eio)
    buf = memoryview(bytearray(2 * PAYLOAD))
    result = asyncio.run(core.read_blocks(keys, buf, [0, PAYLOAD]))
    assert result.blocks == 0 and "OSError" in (result.stop_reason or "")
    core.close()
