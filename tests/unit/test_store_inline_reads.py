"""Warm reads on the event loop (chain.read_cached): a request the page cache holds is read by
the loop itself, checked like any other (a bad block is a miss and deleted); a byte not cached
hands the rest to the read threads; a running stripe, a request over the cap, one worth two
stripes or a cap of 0 keep the threads; a file system without RWF_NOWAIT never reads on the loop."""

from __future__ import annotations

import asyncio
import os
import threading
from pathlib import Path

import numpy as np
import pytest

from services.storage_gateway import block_file, fileio
from services.storage_gateway.block_file import NotCached
from services.storage_gateway.engine import GatewayCore
from shared.kv.full_block import HEADER_SIZE
from tests.unit.store_util import PAYLOAD, fill, make_keys, make_store, payload_for

pytestmark = pytest.mark.unit

HANG_GUARD_S = 60.0  # only a guard against a hung test, never a timing assertion


def _core(root: Path, inline_bytes: int = 8 << 20, **kw: object) -> GatewayCore:
    return GatewayCore(make_store(root), io_threads=2, inline_bytes=inline_bytes, **kw)  # type: ignore[arg-type]


def _where_read(core: GatewayCore) -> list[tuple[str, bool]]:
    """(which read, on the loop's thread?) of every block read through the store."""
    seen: list[tuple[str, bool]] = []
    loop_thread = threading.get_ident()
    for name in ("read_into", "read_cached_into"):
        original = getattr(core.store, name)

        def wrapped(key: bytes, dest: memoryview, _o=original, _n=name) -> int:  # type: ignore[no-untyped-def]
            seen.append((_n, threading.get_ident() == loop_thread))
            return _o(key, dest)

        setattr(core.store, name, wrapped)
    return seen


def _read(core: GatewayCore, keys: list[bytes]) -> tuple[object, np.ndarray]:
    buf = np.zeros(len(keys) * PAYLOAD, np.uint8)
    res = asyncio.run(core.read_blocks(keys, memoryview(buf), [i * PAYLOAD for i in range(len(keys))]))
    return res, buf


def test_a_warm_request_is_read_on_the_loop_and_lands_whole(tmp_path: Path) -> None:
    core = _core(tmp_path)
    keys = make_keys(3)
    fill(core.store, keys)
    where = _where_read(core)
    res, buf = _read(core, keys)
    assert (res.blocks, res.stop_key) == (3, None)
    assert where == [("read_cached_into", True)] * 3
    for i, key in enumerate(keys):
        assert np.array_equal(buf[i * PAYLOAD : (i + 1) * PAYLOAD], payload_for(key))
    assert core.store.stats().blocks_read == 3
    snap = core.queue_snapshot()
    assert (snap.pending_blocks, snap.done_blocks) == (0, 3)
    core.check_integrity()
    core.close()


def test_a_bad_block_read_on_the_loop_is_a_miss_and_deleted(tmp_path: Path) -> None:
    core = _core(tmp_path)
    keys = make_keys(3)
    fill(core.store, keys)
    path = core.store.path_for(keys[1])
    with open(path, "r+b") as f:  # one payload byte flipped: the checksum fails
        f.seek(HEADER_SIZE + 100)
        byte = f.read(1)[0]
        f.seek(HEADER_SIZE + 100)
        f.write(bytes([byte ^ 0xFF]))
    where = _where_read(core)
    res, _ = _read(core, keys)
    assert (res.blocks, res.stop_key) == (1, keys[1])
    assert "checksum" in (res.stop_reason or "")
    assert where == [("read_cached_into", True)] * 2  # nothing past the miss, no thread
    assert not os.path.exists(path)
    assert core.store.stats().corrupt == 1
    core.close()


def test_a_byte_not_cached_hands_the_rest_to_the_threads(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    core = _core(tmp_path)
    keys = make_keys(3)
    fill(core.store, keys)
    real = fileio.pread_cached
    cold = core.store.path_for(keys[1])
    cold_ino = os.stat(cold).st_ino

    def second_block_cold(fd: int, buf: memoryview, offset: int) -> int | None:
        return 0 if os.fstat(fd).st_ino == cold_ino and offset > 0 else real(fd, buf, offset)

    monkeypatch.setattr(fileio, "pread_cached", second_block_cold)
    where = _where_read(core)
    res, buf = _read(core, keys)
    assert (res.blocks, res.stop_key) == (3, None)
    assert where == [("read_cached_into", True), ("read_cached_into", True),
                     ("read_into", False), ("read_into", False)]
    for i, key in enumerate(keys):
        assert np.array_equal(buf[i * PAYLOAD : (i + 1) * PAYLOAD], payload_for(key))
    assert core.store.stats().blocks_read == 3  # the loop's partial try counted nothing
    core.check_integrity()
    core.close()


def test_the_threads_keep_reads_over_the_cap_or_worth_two_stripes_or_with_a_cap_of_0(tmp_path: Path) -> None:
    for kw, n in (({"inline_bytes": 2 * PAYLOAD}, 3), ({"inline_bytes": 0}, 1),
                  ({"stripe_min_bytes": PAYLOAD}, 2)):
        core = _core(tmp_path, **kw)  # type: ignore[arg-type]
        keys = make_keys(n)
        fill(core.store, keys)
        where = _where_read(core)
        res, _ = _read(core, keys)
        assert res.blocks == n
        assert where and all(w == ("read_into", False) for w in where), (kw, where)
        core.close()


def test_a_running_stripe_keeps_a_later_request_off_the_loop(tmp_path: Path) -> None:
    core = _core(tmp_path, inline_bytes=PAYLOAD)  # the 2-block request below is over the cap
    keys = make_keys(3)
    fill(core.store, keys)
    where = _where_read(core)
    held, inside = threading.Event(), threading.Event()
    original = core.store.read_into

    def read_into(key: bytes, dest: memoryview) -> int:
        if key == keys[0]:
            inside.set()
            assert held.wait(HANG_GUARD_S)
        return original(key, dest)

    core.store.read_into = read_into  # type: ignore[method-assign]
    buf = memoryview(np.zeros(3 * PAYLOAD, np.uint8))

    async def main() -> None:
        first = asyncio.ensure_future(core.read_blocks(keys[:2], buf, [0, PAYLOAD]))
        assert await asyncio.to_thread(inside.wait, HANG_GUARD_S)
        second = asyncio.ensure_future(core.read_blocks(keys[2:], buf, [2 * PAYLOAD]))
        await asyncio.sleep(0)
        held.set()
        assert (await first).blocks == 2 and (await second).blocks == 1

    asyncio.run(main())
    assert ("read_cached_into", True) not in where
    core.close()


def test_cached_only_reads_never_wait_and_need_rwf_nowait(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    store = make_store(tmp_path)
    key = make_keys(1)[0]
    fill(store, [key])
    out = memoryview(bytearray(PAYLOAD))
    monkeypatch.setattr(fileio, "pread_cached", lambda *_: 0)
    with pytest.raises(NotCached):
        store.read_cached_into(key, out)
    assert store.stats().blocks_read == 0 and os.path.exists(store.path_for(key))
    opened: list[str] = []
    monkeypatch.setattr(store, "_open_file", lambda k: opened.append("open"))
    store._reader.nowait_reads = False  # the file system refused RWF_NOWAIT once
    with pytest.raises(NotCached):
        store.read_cached_into(key, out)
    assert opened == []  # not even opened on the loop
    monkeypatch.undo()
    monkeypatch.setattr(block_file, "READ_CHUNK", 1000)  # several chunks, each hashed as it lands
    store._reader.nowait_reads = True
    assert store.read_cached_into(key, out) == PAYLOAD
    assert np.array_equal(np.frombuffer(out, np.uint8), payload_for(key))
