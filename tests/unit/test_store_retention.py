"""Agents' retention hints in the store: retained blocks outlive unhinted ones until their TTL,
demoted ones go first, release ends a session's retention, and the capacity limit always holds."""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from services.storage_gateway.retention import Level, Retention
from tests.unit.store_util import FILE_BYTES, fill, make_keys, make_store, read_back

pytestmark = pytest.mark.unit


class Clock:
    """The store's wall clock, moved by hand (from now: files' mtimes must not look newer than uses)."""

    def __init__(self) -> None:
        self.t = time.time() + 10

    def __call__(self) -> float:
        return self.t


def test_victims_come_demoted_first_then_lru_then_retained_until_the_ttl() -> None:
    r = Retention()
    lru = [b"R", b"A", b"D", b"B"]
    assert r.mark([b"R"], Level.RETAINED, 100.0, "s1", now=0.0) == 1
    assert r.mark([b"D"], Level.DEMOTED, 100.0, "s2", now=0.0) == 2
    order, left = [], list(lru)
    while left:
        k = r.victim(left, lambda _: False, now=50.0)
        order.append(k)
        left.remove(k)
    assert order == [b"D", b"A", b"B", b"R"]
    assert r.victim(lru, lambda _: False, now=150.0) == b"R"  # the mark expired: plain LRU again
    assert r.victim(lru, lambda k: k == b"R", now=150.0) == b"A"  # pins are still skipped
    r.check_integrity()


def test_another_sessions_demotion_never_lowers_a_retained_shared_prefix() -> None:
    r = Retention()
    r.mark([b"P"], Level.RETAINED, 100.0, "s1", now=0.0)
    r.mark([b"P", b"X"], Level.DEMOTED, 100.0, "s2", now=0.0)
    assert r.level(b"P", 10.0) == Level.RETAINED and r.level(b"X", 10.0) == Level.DEMOTED
    assert r.release("s1") == 1 and r.level(b"P", 10.0) == Level.NORMAL
    r.check_integrity()


def test_a_retained_session_outlives_unhinted_blocks_in_a_full_store(tmp_path: Path) -> None:
    clock = Clock()
    store = make_store(tmp_path, capacity_bytes=4 * FILE_BYTES, clock=clock)
    hinted, other = make_keys(2), make_keys(4, start=10_000)
    fill(store, hinted)  # the oldest blocks: plain LRU would evict them first
    store.retain(hinted, Level.RETAINED, 60.0, "s1")
    fill(store, other)
    assert all(store.contains(k) for k in hinted), "retained blocks were evicted before unhinted ones"
    assert sum(store.contains(k) for k in other) == 2
    assert store.stats().bytes <= 4 * FILE_BYTES
    store.check_integrity()


def test_after_the_ttl_or_a_release_retained_blocks_are_ordinary_again(tmp_path: Path) -> None:
    clock = Clock()
    store = make_store(tmp_path, capacity_bytes=3 * FILE_BYTES, clock=clock)
    a, b = make_keys(1), make_keys(1, start=5_000)
    fill(store, a + b)
    store.retain(a, Level.RETAINED, 60.0, "sa")
    store.retain(b, Level.RETAINED, 600.0, "sb")
    clock.t += 61  # a's TTL passed
    fill(store, make_keys(2, start=9_000))
    assert not store.contains(a[0]) and store.contains(b[0])
    assert store.release("sb") == 1
    clock.t += 1
    fill(store, make_keys(1, start=12_000))  # b is the oldest ordinary block now
    assert not store.contains(b[0])
    store.check_integrity()


def test_the_capacity_holds_when_everything_is_retained(tmp_path: Path) -> None:
    store = make_store(tmp_path, capacity_bytes=2 * FILE_BYTES, clock=Clock())
    keys = make_keys(3)
    store.retain(keys, Level.RETAINED, 600.0, "s")  # marked before the blocks are written
    fill(store, keys)
    assert store.stats().bytes <= 2 * FILE_BYTES
    assert not store.contains(keys[0]) and store.contains(keys[2])  # the oldest retained one went
    store.check_integrity()


def test_demoted_blocks_go_before_older_ordinary_ones(tmp_path: Path) -> None:
    store = make_store(tmp_path, capacity_bytes=3 * FILE_BYTES, clock=Clock())
    old, done = make_keys(1), make_keys(2, start=7_000)
    fill(store, old + done)
    read_back(store, done[0])
    store.retain(done, Level.DEMOTED, 60.0, "finished")
    fill(store, make_keys(2, start=20_000))
    assert store.contains(old[0]) and not any(store.contains(k) for k in done)
    store.check_integrity()
