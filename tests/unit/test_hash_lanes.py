"""Hash lanes: a read's chunks hashed on another thread, in order, drained before the lease ends."""

from __future__ import annotations

import threading

import numpy as np
import pytest
import xxhash

from services.storage_gateway.hash_lanes import HashLanes


def _chunks(data: np.ndarray, size: int) -> list[memoryview]:
    view = memoryview(data)
    return [view[i : i + size] for i in range(0, len(view), size)]


def test_a_lane_hashes_every_chunk_in_order() -> None:
    data = np.random.default_rng(0).integers(0, 256, 3 * 2**20 + 17, dtype=np.uint8)
    lanes = HashLanes("t-hash")
    try:
        for size in (4096, 65536, 2**20):
            hasher = xxhash.xxh3_64()
            with lanes.lease() as lane:
                for part in _chunks(data, size):
                    lane.feed(hasher, part)
            assert hasher.intdigest() == xxhash.xxh3_64_intdigest(memoryview(data))
        assert lanes.threads == 1  # leased one at a time: the same lane each time
    finally:
        lanes.close()


def test_reads_at_once_lease_lanes_of_their_own() -> None:
    data = [np.random.default_rng(i).integers(0, 256, 2**20, dtype=np.uint8) for i in range(4)]
    lanes = HashLanes("t-hash")
    inside = threading.Barrier(len(data))
    digests: dict[int, int] = {}

    def read(i: int) -> None:
        hasher = xxhash.xxh3_64()
        with lanes.lease() as lane:
            inside.wait()  # every lease is held at once
            for part in _chunks(data[i], 8192):
                lane.feed(hasher, part)
        digests[i] = hasher.intdigest()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(data))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert lanes.threads == len(data)
        assert digests == {i: xxhash.xxh3_64_intdigest(memoryview(d)) for i, d in enumerate(data)}
    finally:
        lanes.close()


def test_an_update_that_fails_raises_at_the_end_of_the_lease_and_the_lane_goes_on() -> None:
    lanes = HashLanes("t-hash")
    try:
        hasher = xxhash.xxh3_64()
        with pytest.raises(TypeError):
            with lanes.lease() as lane:
                lane.feed(hasher, 12345)  # type: ignore[arg-type]  # not a buffer
                lane.feed(hasher, memoryview(b"after"))
        hasher = xxhash.xxh3_64()
        with lanes.lease() as lane:
            lane.feed(hasher, memoryview(b"abc"))
        assert hasher.intdigest() == xxhash.xxh3_64_intdigest(b"abc")
    finally:
        lanes.close()


def test_a_read_that_fails_still_waits_for_its_hashes_and_keeps_its_own_error() -> None:
    lanes = HashLanes("t-hash")
    data = np.ones(4 * 2**20, np.uint8)
    hasher = xxhash.xxh3_64()
    try:
        with pytest.raises(KeyError):
            with lanes.lease() as lane:
                for part in _chunks(data, 2**20):
                    lane.feed(hasher, part)
                lane.feed(hasher, 7)  # type: ignore[arg-type]  # fails too, after the read's error
                raise KeyError("the read failed")
        # the lease ended only after every queued update ran: the hasher saw all four chunks
        assert hasher.intdigest() == xxhash.xxh3_64_intdigest(memoryview(data))
    finally:
        lanes.close()
    assert lanes.threads == 0


def test_a_forked_child_makes_lanes_of_its_own() -> None:
    import multiprocessing as mp

    lanes = HashLanes("t-hash")
    with lanes.lease() as lane:  # the parent's lane thread exists now
        lane.feed(xxhash.xxh3_64(), memoryview(b"x"))
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()

    def in_child() -> None:
        hasher = xxhash.xxh3_64()
        with lanes.lease() as lane:  # would wait forever on a thread that is not there
            lane.feed(hasher, memoryview(b"abc"))
        child.send((hasher.intdigest(), lanes.threads))

    proc = ctx.Process(target=in_child)
    proc.start()
    digest, threads = parent.recv()
    proc.join()
    try:
        assert digest == xxhash.xxh3_64_intdigest(b"abc") and threads == 1
        assert proc.exitcode == 0
    finally:
        lanes.close()


def test_a_read_gets_a_lane_only_while_a_core_is_left_for_its_hash_thread() -> None:
    lanes = HashLanes("t-hash", cores=2)
    data = memoryview(b"abc" * 1000)
    try:
        with lanes.lease() as first:  # alone: the second core hashes beside it
            assert first is not None
            with lanes.lease() as second:  # both cores busy (a reader and a hash thread): hashed inline
                assert second is None
                with lanes.lease() as third:
                    assert third is None
            hasher = xxhash.xxh3_64()
            first.feed(hasher, data)
        assert hasher.intdigest() == xxhash.xxh3_64_intdigest(data)
        with pytest.raises(KeyError):
            with lanes.lease() as lane:
                assert lane is not None
                raise KeyError("a read that failed")
        with lanes.lease() as again:  # the failed read gave its lane and its core back
            assert again is not None
        assert lanes.threads == 1
    finally:
        lanes.close()
    one_core = HashLanes("t-hash", cores=1)
    with one_core.lease() as lane:  # no core to spare at all
        assert lane is None
    assert one_core.threads == 0
