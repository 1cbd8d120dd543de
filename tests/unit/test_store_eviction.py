"""Capacity: least-recently-used eviction, pins, shared recency via mtime."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from services.storage_gateway.lru import LruIndex
from services.storage_gateway.store import WriteOutcome
from tests.unit.store_util import FILE_BYTES, fill, make_keys, make_store, payload_for, read_back

pytestmark = pytest.mark.unit


def test_lru_index_orders_and_skips_pins() -> None:
    index = LruIndex()
    for i, key in enumerate([b"a", b"b", b"c"]):
        index.touch(key, 10, float(i))
    index.touch(b"a", 10, 5.0)  # a is now the most recent
    assert index.keys_oldest_first() == [b"b", b"c", b"a"]
    index.pin(b"b")
    assert index.oldest_unpinned() is not None
    assert index.oldest_unpinned()[0] == b"c"  # type: ignore[index]
    index.unpin(b"b")
    assert index.remove(b"b") == 10 and index.remove(b"zz") == 0
    assert index.total_bytes == 20
    index.check_integrity()


def test_least_recently_used_goes_first_and_capacity_holds(tmp_path: Path) -> None:
    store = make_store(tmp_path, capacity_bytes=3 * FILE_BYTES)
    k = make_keys(5)
    fill(store, k[:3])
    read_back(store, k[0])  # k0 used again: k1 is now the oldest
    fill(store, [k[3]])
    assert not store.contains(k[1])
    fill(store, [k[4]])
    assert not store.contains(k[2])
    assert store.resident_keys() == [k[0], k[3], k[4]]
    stats = store.stats()
    assert (stats.evictions, stats.evicted_bytes) == (2, 2 * FILE_BYTES)
    assert stats.bytes <= 3 * FILE_BYTES
    store.check_integrity()


def test_pinned_blocks_are_never_evicted(tmp_path: Path) -> None:
    store = make_store(tmp_path, capacity_bytes=2 * FILE_BYTES)
    k = make_keys(4)
    fill(store, k[:2])
    with store.pinned([k[0]]):
        fill(store, [k[2]])  # k0 is the oldest but pinned: k1 goes
        assert store.contains(k[0]) and not store.contains(k[1])
        with store.pinned([k[2]]):
            assert store.write(k[3], memoryview(payload_for(k[3]))) is WriteOutcome.NO_SPACE
    assert store.stats().write_no_space == 1
    fill(store, [k[3]])  # unpinned now: k0 (oldest) goes
    assert not store.contains(k[0]) and store.contains(k[3])
    store.check_integrity()


def test_a_smaller_capacity_at_restart_evicts_oldest_first(tmp_path: Path) -> None:
    k = make_keys(4)
    fill(make_store(tmp_path), k)
    for age, key in enumerate(k):  # k0 newest ... k3 oldest
        t = 1_700_000_000 - 100 * age
        os.utime(make_store(tmp_path).path_for(key), (t, t))
    store = make_store(tmp_path, capacity_bytes=2 * FILE_BYTES)
    assert store.resident_keys() == [k[1], k[0]]
    assert store.longest_prefix(k) == 2


def test_a_read_by_another_gateway_gives_a_block_a_second_chance(tmp_path: Path) -> None:
    # explicit times, not sleeps past the file system's timestamp granularity: mine last used
    # its blocks a minute ago, and their files were last touched two minutes ago
    mine = make_store(tmp_path, capacity_bytes=3 * FILE_BYTES, clock=lambda: time.time() - 60)
    k = make_keys(4)
    fill(mine, k[:3])
    long_ago = time.time() - 120
    for key in k[:3]:
        os.utime(mine.path_for(key), (long_ago, long_ago))
    other = make_store(tmp_path, touch_interval_s=0.0)
    read_back(other, k[0])  # touches k0's mtime
    fill(mine, [k[3]])  # mine thinks k0 is oldest, but its mtime says otherwise
    assert mine.contains(k[0]) and not mine.contains(k[1])
    mine.check_integrity()


def test_unlimited_capacity_never_evicts(tmp_path: Path) -> None:
    store = make_store(tmp_path)
    fill(store, make_keys(10))
    assert store.stats().evictions == 0
    store.evict_to(4 * FILE_BYTES)
    assert store.stats().blocks == 4 and store.stats().evictions == 6
