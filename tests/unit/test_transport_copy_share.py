"""A shared bulk copy: each piece claimed by one side (the caller in order from the front, the
worker from the back), the worker leaves a helping caller the last pieces,
exactly one finish completes the transfer, a failed piece stops further claims."""

import asyncio

import numpy as np
import pytest

from shared.transport.copy_share import TAIL, SharedCopy, cut

pytestmark = pytest.mark.unit


def _job(n: int, helping: bool = True, size: int = 4) -> SharedCopy:
    loop = asyncio.new_event_loop()
    try:
        fut = loop.create_future()
    finally:
        loop.close()
    bufs = [memoryview(bytearray([i]) * size) for i in range(n)]
    return SharedCopy([(b, b) for b in bufs], fut, loop, helping)


def test_cut_keeps_order_drops_empty_pairs_and_cuts_long_ones_into_array_slices():
    bufs = [memoryview(bytearray(n)) for n in (3, 0, 20)]
    pieces = cut([(b, b) for b in bufs], size=8)
    assert [len(d) for d, _ in pieces] == [3, 8, 8, 4]
    assert pieces[0][0] is bufs[0] and all(isinstance(d, np.ndarray) for d, _ in pieces[1:])


def test_each_piece_is_claimed_once_and_the_worker_leaves_the_tail_to_a_helping_caller():
    job = _job(10)
    assert [d[0] for d, _ in job.caller_claim(8)] == [0, 1]  # in order, about 8 bytes
    tried = [job.worker_claim() for _ in range(10)]
    took = [p for p in tried if p is not None]
    assert [d[0] for d, _ in took] == list(range(9, 1 + TAIL, -1))  # from the back, the last TAIL left
    rest = job.caller_claim(1 << 20)
    assert [d[0] for d, _ in rest] == list(range(2, 2 + TAIL)) and job.caller_claim(1 << 20) == []
    assert not job.finish(None, 2) and not job.finish(None, len(took))  # the caller's rest is in flight
    assert job.finish(None, len(rest))  # the last landing completes it, once
    assert job.pieces == []  # the views are dropped


def test_a_caller_that_stops_helping_leaves_everything_to_the_worker():
    job = _job(5)
    assert [d[0] for d, _ in job.caller_claim(4)] == [0]  # about 4 bytes: one piece
    assert job.unclaimed(False) == 4 * 4
    got = [job.worker_claim() for _ in range(5)]
    assert [d[0] for d, _ in got[:4]] == [4, 3, 2, 1] and got[4] is None
    assert not job.finish(None, 4)
    assert job.finish(None)  # the caller's piece landed last: it completes


def test_a_failed_piece_stops_claims_and_completes_once_the_piece_in_flight_lands():
    job = _job(6, helping=False)
    a, b = job.worker_claim(), job.worker_claim()
    assert a is not None and b is not None
    err = ValueError("bad view")
    assert not job.finish(err)  # b is still in flight
    assert job.worker_claim() is None and job.caller_claim(1 << 20) == []
    assert job.finish(None) and job.exc is err


def test_an_abandoned_copy_claims_nothing_more():
    job = _job(4, helping=False)
    assert job.worker_claim() is not None
    job.abandon()
    assert job.worker_claim() is None and job.caller_claim(1 << 20) == []
