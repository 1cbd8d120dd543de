"""Hash lanes: the far half of a read run on another thread, drained before the lease ends."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from services.storage_gateway.hash_lanes import HashLanes
from shared.kv.segment_sum import SEGMENT, SegmentHasher, segmented_checksum


def _halves(data: np.ndarray) -> tuple[memoryview, memoryview, int]:
    view = memoryview(data)
    half = (len(view) // SEGMENT // 2) * SEGMENT
    return view[:half], view[half:], half


def test_a_lane_hashes_the_far_half_while_the_reader_hashes_the_near_one() -> None:
    data = np.random.default_rng(0).integers(0, 256, 3 * 2**20 + 17, dtype=np.uint8)
    near_part, far_part, half = _halves(data)
    lanes = HashLanes("t-hash")
    try:
        for _ in range(3):
            near, far = SegmentHasher(), SegmentHasher(half)
            with lanes.lease() as lane:
                lane.run(lambda: far.update(far_part))
                near.update(near_part)
            near.join(far)
            assert near.intdigest() == segmented_checksum(memoryview(data))
        assert lanes.threads == 1  # leased one at a time: the same lane each time
    finally:
        lanes.close()


def test_reads_at_once_lease_lanes_of_their_own() -> None:
    data = [np.random.default_rng(i).integers(0, 256, 2**20, dtype=np.uint8) for i in range(4)]
    lanes = HashLanes("t-hash")
    inside = threading.Barrier(len(data))
    digests: dict[int, int] = {}

    def read(i: int) -> None:
        near_part, far_part, half = _halves(data[i])
        near, far = SegmentHasher(), SegmentHasher(half)
        with lanes.lease() as lane:
            inside.wait()  # every lease is held at once
            lane.run(lambda: far.update(far_part))
            near.update(near_part)
        near.join(far)
        digests[i] = near.intdigest()

    threads = [threading.Thread(target=read, args=(i,)) for i in range(len(data))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert lanes.threads == len(data)
        assert digests == {i: segmented_checksum(memoryview(d)) for i, d in enumerate(data)}
    finally:
        lanes.close()


def test_a_call_that_fails_raises_at_the_end_of_the_lease_and_the_lane_goes_on() -> None:
    lanes = HashLanes("t-hash")
    try:
        with pytest.raises(TypeError):
            with lanes.lease() as lane:
                lane.run(lambda: SegmentHasher().update(12345))  # type: ignore[arg-type]  # not a buffer
        done: list[int] = []
        with lanes.lease() as lane:
            lane.run(lambda: done.append(1))
        assert done == [1] and lanes.threads == 1
    finally:
        lanes.close()


def test_a_read_that_fails_still_waits_for_its_lane_and_keeps_its_own_error() -> None:
    lanes = HashLanes("t-hash")
    started, release = threading.Event(), threading.Event()
    finished: list[str] = []

    def far_half() -> None:  # still writing the read's buffer when the reader fails
        started.set()
        release.wait()
        finished.append("far")
        raise ValueError("the far half failed too")

    try:
        with pytest.raises(KeyError):
            with lanes.lease() as lane:
                lane.run(far_half)
                started.wait()
                threading.Timer(0, release.set).start()
                raise KeyError("the read failed")
        assert finished == ["far"]  # the lease ended only after the lane's call had
    finally:
        lanes.close()
    assert lanes.threads == 0


def test_a_forked_child_makes_lanes_of_its_own() -> None:
    import multiprocessing as mp

    lanes = HashLanes("t-hash")
    with lanes.lease() as lane:  # the parent's lane thread exists now
        lane.run(lambda: None)
    ctx = mp.get_context("fork")
    parent, child = ctx.Pipe()

    def in_child() -> None:
        out: list[int] = []
        with lanes.lease() as lane:  # would wait forever on a thread that is not there
            lane.run(lambda: out.append(7))
        child.send((out, lanes.threads))

    proc = ctx.Process(target=in_child)
    proc.start()
    out, threads = parent.recv()
    proc.join()
    try:
        assert out == [7] and threads == 1
        assert proc.exitcode == 0
    finally:
        lanes.close()


def test_a_read_gets_a_lane_only_while_a_core_is_left_for_its_lane_thread() -> None:
    lanes = HashLanes("t-hash", cores=2)
    try:
        with lanes.lease() as first:  # alone: the second core takes its far half
            assert first is not None
            with lanes.lease() as second:  # both cores busy (a reader and a lane): all on its own thread
                assert second is None
                with lanes.lease() as third:
                    assert third is None
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
