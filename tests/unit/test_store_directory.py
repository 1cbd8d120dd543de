"""Directory store: atomic writes, verified zero-copy reads, corruption as a miss,
restart, and reads surviving concurrent unlinks."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pytest

from services.storage_gateway import block_file, fileio
from services.storage_gateway.errors import BlockCorrupt, BlockMissing
from services.storage_gateway.hash_lanes import HashLanes
from services.storage_gateway.store import DirectoryStore, WriteOutcome
from shared.kv import segment_sum
from shared.kv.full_block import HEADER_SIZE, SizeMismatch
from shared.kv.hashing import ModelFingerprint
from shared.kv.layout import KVLayout
from tests.unit.store_util import (
    FILE_BYTES,
    LAYOUT,
    PAYLOAD,
    fill,
    make_keys,
    make_store,
    payload_for,
    read_back,
)

pytestmark = pytest.mark.unit


def test_write_then_read_into_a_buffer_slice(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    key = make_keys(1)[0]
    assert store.write(key, memoryview(payload_for(key))) is WriteOutcome.WRITTEN
    assert os.path.getsize(store.path_for(key)) == FILE_BYTES
    # Read into the middle of a larger (shared-memory-like) buffer.
    buf = np.zeros(3 * PAYLOAD, np.uint8)
    assert store.read_into(key, memoryview(buf)[PAYLOAD : 2 * PAYLOAD]) == PAYLOAD
    assert np.array_equal(buf[PAYLOAD : 2 * PAYLOAD], payload_for(key))
    assert not buf[:PAYLOAD].any() and not buf[2 * PAYLOAD :].any()
    stats = store.stats()
    assert (stats.blocks_written, stats.blocks_read, stats.bytes_read) == (1, 1, PAYLOAD)
    store.check_integrity()


def test_existing_block_is_skipped_and_no_temp_files_remain(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    key = make_keys(1)[0]
    fill(store, [key])
    assert store.write(key, memoryview(payload_for(key))) is WriteOutcome.EXISTS
    assert store.stats().write_skipped == 1
    leftovers = [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]
    assert leftovers == []


def test_wrong_payload_size_is_refused(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    with pytest.raises(SizeMismatch):
        store.write(make_keys(1)[0], memoryview(bytes(PAYLOAD - 1)))


def test_missing_block_is_a_typed_miss(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    key = make_keys(1)[0]
    with pytest.raises(BlockMissing) as err:
        read_back(store, key)
    assert err.value.key == key
    assert store.stats().read_misses == 1


def _flip(offset: int) -> object:
    def corrupt(path: str) -> None:
        with open(path, "r+b") as f:
            f.seek(offset)
            byte = f.read(1)
            f.seek(offset)
            f.write(bytes([byte[0] ^ 0x5A]))

    return corrupt


def _truncate(path: str) -> None:
    os.truncate(path, FILE_BYTES - 100)


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        (_flip(HEADER_SIZE + 123), "payload checksum"),
        (_flip(40), "header checksum"),
        (_flip(2), "magic"),
        (_truncate, "file size"),
    ],
    ids=["payload-byte", "header-byte", "magic", "truncated"],
)
def test_corrupt_block_is_deleted_counted_and_then_missing(
    tmp_path: Path, damage: object, reason: str
) -> None:
    store = make_store(tmp_path)
    key = make_keys(1)[0]
    fill(store, [key])
    damage(store.path_for(key))  # type: ignore[operator]
    with pytest.raises(BlockCorrupt) as err:
        read_back(store, key)
    assert err.value.key == key and reason in err.value.reason
    assert not os.path.exists(store.path_for(key))
    assert store.stats().corrupt == 1
    with pytest.raises(BlockMissing):
        read_back(store, key)
    assert store.longest_prefix([key]) == 0
    store.check_integrity()


@pytest.mark.parametrize("hashing", ["beside", "inline", "cores-busy"])
@pytest.mark.parametrize("cached", [True, False], ids=["cached", "from-disk"])
@pytest.mark.parametrize("at", [0, 64 * 1024 - 1, 64 * 1024, 160 * 1024 + 7, 256 * 1024 - 1, 256 * 1024,
                                300 * 1024, 500 * 1024, -3],
                         ids=["first", "first-end", "chunk-start", "mid-chunk", "near-end", "far-start",
                              "far-mid", "tail", "last"])
def test_large_blocks_are_verified_chunk_by_chunk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, at: int, cached: bool, hashing: str
) -> None:
    # 512 KiB payload in 64 KiB segments: a 64 KiB first chunk, then 96 KiB chunks (cached
    # bytes) or 64 KiB ones (bytes the page cache does not hold), each half's last one short;
    # the far half [256 KiB, 512 KiB) read and hashed on a lane meanwhile, or all inline
    monkeypatch.setattr(block_file, "COLD_CHUNK", 64 * 1024)
    monkeypatch.setattr(block_file, "READ_CHUNK", 96 * 1024)
    monkeypatch.setattr(segment_sum, "SEGMENT", 64 * 1024)
    if not cached:
        monkeypatch.setattr(fileio, "pread_cached", lambda *_: 0)
    big = KVLayout(n_layers=8, n_kv_heads=4, head_dim=64, dtype="float16", block_size=64)
    fp = ModelFingerprint.from_layout("big", big).digest()
    store = DirectoryStore(tmp_path, fp, big)
    lanes = HashLanes("test-hash", cores=2 if hashing == "cores-busy" else None)
    store.reader.lanes = None if hashing == "inline" else lanes
    if hashing == "cores-busy":  # another read holds the lane and the spare core: these hash inline
        busy = lanes.lease()
        assert busy.__enter__() is not None
    key = make_keys(1)[0]
    payload = np.random.default_rng(1).integers(0, 256, big.payload_bytes, dtype=np.uint8)
    store.write(key, memoryview(payload))
    out = np.zeros(big.payload_bytes, np.uint8)
    store.read_into(key, memoryview(out))
    assert np.array_equal(out, payload)
    _flip(HEADER_SIZE + at % big.payload_bytes)(store.path_for(key))  # type: ignore[operator]
    with pytest.raises(BlockCorrupt, match="payload checksum"):
        store.read_into(key, memoryview(out))
    assert not os.path.exists(store.path_for(key))
    assert lanes.threads == (0 if hashing == "inline" else 1)  # one read at a time (or the busy one): one lane
    if hashing == "cores-busy":
        busy.__exit__(None, None, None)
        assert lanes._hashing == 0 and lanes._reading == 0
    lanes.close()


@pytest.mark.parametrize("lanes_on", [True, False], ids=["lanes", "inline"])
def test_a_version_2_block_is_still_read_and_verified(tmp_path: Path, lanes_on: bool) -> None:
    """A block written before the segmented checksum (version 2: xxh3_64 of the whole payload) is
    served, all on the reading thread; one with a flipped payload byte is refused."""
    import struct

    import xxhash

    big = KVLayout(n_layers=8, n_kv_heads=4, head_dim=64, dtype="float16", block_size=128)  # 1 MiB
    store = DirectoryStore(tmp_path, ModelFingerprint.from_layout("big", big).digest(), big)
    lanes = HashLanes("test-hash")
    store.reader.lanes = lanes if lanes_on else None
    keys = make_keys(2)
    payload = np.random.default_rng(2).integers(0, 256, big.payload_bytes, dtype=np.uint8)
    for key in keys:
        store.write(key, memoryview(payload))
        with open(store.path_for(key), "r+b") as f:  # rewrite it as version 2 wrote it
            header = bytearray(f.read(HEADER_SIZE))
            struct.pack_into("<H", header, 8, 2)
            struct.pack_into("<Q", header, 72, xxhash.xxh3_64_intdigest(memoryview(payload)))
            struct.pack_into("<Q", header, HEADER_SIZE - 8, xxhash.xxh3_64_intdigest(bytes(header[:HEADER_SIZE - 8])))
            f.seek(0)
            f.write(header)
    out = np.zeros(big.payload_bytes, np.uint8)
    store.read_into(keys[0], memoryview(out))
    assert np.array_equal(out, payload)
    _flip(HEADER_SIZE + big.payload_bytes - 5)(store.path_for(keys[1]))  # type: ignore[operator]
    with pytest.raises(BlockCorrupt, match="payload checksum"):
        store.read_into(keys[1], memoryview(out))
    assert lanes.threads == 0  # a version-2 checksum cannot be split
    lanes.close()


def test_partly_cached_blocks_read_the_rest_from_disk(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = make_store(tmp_path)
    monkeypatch.setattr(block_file, "COLD_CHUNK", 1024)
    keys = make_keys(2)
    fill(store, keys)
    real = fileio.pread_cached
    asked: list[int] = []

    def partly(fd: int, buf: memoryview, offset: int) -> int | None:
        asked.append(offset)  # every other call: 1000 bytes cached, then none
        return real(fd, buf[:1000], offset) if len(asked) % 2 else 0

    monkeypatch.setattr(fileio, "pread_cached", partly)
    assert np.array_equal(read_back(store, keys[0]), payload_for(keys[0]))
    assert len(asked) > 2

    def unsupported(fd: int, buf: memoryview, offset: int) -> None:
        asked.append(offset)

    asked.clear()
    monkeypatch.setattr(fileio, "pread_cached", unsupported)
    for key in keys:  # asked once, then never again: plain blocking reads
        assert np.array_equal(read_back(store, key), payload_for(key))
    assert len(asked) == 1


def test_cached_reads_never_wait_and_fill_what_is_cached(tmp_path: Path) -> None:
    path = tmp_path / "f"
    path.write_bytes(bytes(range(256)) * 64)
    fd = os.open(path, os.O_RDONLY)
    try:
        buf = bytearray(20_000)
        got = fileio.pread_cached(fd, memoryview(buf), 100)
        if got is None:
            pytest.skip("no RWF_NOWAIT reads on this platform or file system")
        assert got == 16_384 - 100  # warm: everything up to the end of the file
        assert bytes(buf[:got]) == (bytes(range(256)) * 64)[100:]
    finally:
        os.close(fd)


def test_a_block_of_another_model_or_key_is_corrupt(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    a, b = make_keys(2)
    fill(store, [a])
    other_fp = ModelFingerprint.from_layout("other-model", LAYOUT).digest()
    other = DirectoryStore(tmp_path, other_fp, LAYOUT)
    fill(other, [b])
    os.replace(other.path_for(b), _place(store, b))  # right name, wrong model
    with pytest.raises(BlockCorrupt, match="fingerprint"):
        read_back(store, b)
    os.link(store.path_for(a), _place(store, b))  # right model, wrong key
    with pytest.raises(BlockCorrupt, match="block key"):
        read_back(store, b)
    assert np.array_equal(read_back(store, a), payload_for(a))  # the original is intact


def _place(store: DirectoryStore, key: bytes) -> str:
    path = store.path_for(key)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    return path


def test_a_store_with_another_layout_never_serves_the_block(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    key = make_keys(1)[0]
    fill(store, [key])
    bigger = KVLayout(n_layers=3, n_kv_heads=2, head_dim=32, dtype="float16", block_size=16)
    wrong = DirectoryStore(tmp_path, store.fingerprint, bigger)  # misconfigured reader
    with pytest.raises(BlockCorrupt):
        wrong.read_into(key, memoryview(bytearray(bigger.payload_bytes)))


def test_restart_sees_blocks_and_rebuilds_lru_from_mtimes(tmp_path: Path) -> None:
    keys = make_keys(4)
    first = make_store(tmp_path)
    fill(first, keys)
    for age, key in enumerate(keys):  # keys[0] newest ... keys[3] oldest
        t = 1_700_000_000 - 100 * age
        os.utime(first.path_for(key), (t, t))
    again = make_store(tmp_path)
    assert again.longest_prefix(keys) == 4
    assert again.resident_keys() == list(reversed(keys))
    assert again.stats().bytes == 4 * FILE_BYTES
    assert np.array_equal(read_back(again, keys[2]), payload_for(keys[2]))
    again.check_integrity()


def test_restart_removes_stale_temp_files_only(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    key = make_keys(1)[0]
    fill(store, [key])
    folder = os.path.dirname(store.path_for(key))
    stale, fresh = os.path.join(folder, ".a.1.x.tmp"), os.path.join(folder, ".b.2.y.tmp")
    for path in (stale, fresh):
        Path(path).write_bytes(b"partial")
    os.utime(stale, (1_000_000, 1_000_000))
    make_store(tmp_path)
    assert not os.path.exists(stale) and os.path.exists(fresh)


def test_read_survives_the_file_being_evicted_by_another_gateway(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    reader = make_store(tmp_path)
    key = make_keys(1)[0]
    fill(reader, [key])
    original = reader._reader.read_fd
    evicted: list[int] = []

    def evict_between_open_and_read(*args: object) -> None:
        other = make_store(tmp_path, capacity_bytes=0)  # evicts everything it sees
        evicted.append(other.stats().evictions)
        original(*args)  # type: ignore[arg-type]

    monkeypatch.setattr(reader._reader, "read_fd", evict_between_open_and_read)
    assert np.array_equal(read_back(reader, key), payload_for(key))
    assert evicted == [1] and not os.path.exists(reader.path_for(key))
