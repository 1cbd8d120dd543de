"""Token bucket (emulated storage NIC): pure core on a fake clock, asyncio rate."""

from __future__ import annotations

import asyncio
import heapq
import itertools
import types

import pytest

from services.storage_gateway import bucket as bucket_mod
from services.storage_gateway.bucket import TokenBucket, gbps_to_bytes

pytestmark = pytest.mark.unit


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def test_reserve_goes_into_debt_and_reports_the_wait() -> None:
    clock = FakeClock()
    bucket = TokenBucket(100.0, 50, clock=clock)
    assert bucket.reserve(50) == 0.0
    assert bucket.reserve(50) == pytest.approx(0.5)
    assert bucket.reserve(20) == pytest.approx(0.7)  # queued behind the debt
    clock.now = 0.7
    assert bucket.time_to_ready(1) == pytest.approx(0.01)


def test_try_acquire_never_goes_into_debt() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000.0, 100, clock=clock)
    assert bucket.try_acquire(100)
    assert not bucket.try_acquire(1)
    assert bucket.time_to_ready(50) == pytest.approx(0.05)
    clock.now = 0.05
    assert bucket.try_acquire(50)
    clock.now = 100.0  # refill caps at burst
    assert bucket.time_to_ready(100) == 0.0
    assert not bucket.try_acquire(101)  # above burst: never at once
    assert bucket.try_acquire(100)


def test_unlimited_bucket_never_waits() -> None:
    bucket = TokenBucket(None)
    assert bucket.unlimited and bucket.reserve(10**12) == 0.0 and bucket.try_acquire(10**12)
    asyncio.run(bucket.acquire(10**12))
    assert TokenBucket.from_gbps(None).unlimited and TokenBucket.from_gbps(0.0).unlimited


def test_from_gbps_converts_link_speed() -> None:
    bucket = TokenBucket.from_gbps(400.0, burst_s=0.001)
    assert bucket.rate == gbps_to_bytes(400.0) == 50e9
    assert bucket.burst == 50_000_000


def test_cancelled_wait_refunds_its_chunk() -> None:
    clock = FakeClock()
    bucket = TokenBucket(1000.0, 1000, clock=clock)

    async def main() -> None:
        await bucket.acquire(1000)  # drains the burst, no wait
        waiter = asyncio.create_task(bucket.acquire(1000))  # owned and awaited below
        await asyncio.sleep(0)
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter

    asyncio.run(main())
    assert bucket.time_to_ready(1000) == pytest.approx(1.0)  # not 2.0


class VirtualTime:
    """The bucket's clock and its sleep, on virtual time: whenever every task sleeps, time
    jumps to the earliest wake-up (a discrete-event loop on asyncio). No wall clock involved,
    so the rate the bucket delivers is measured exactly, however loaded the machine is."""

    def __init__(self) -> None:
        self.now = 0.0
        self.sleepers: list[tuple[float, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()

    def __call__(self) -> float:
        return self.now

    async def sleep(self, delay: float) -> None:
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        heapq.heappush(self.sleepers, (self.now + delay, next(self._seq), fut))
        await fut

    async def drive(self, tasks: list[asyncio.Task[None]]) -> None:
        while True:
            while sum(t.done() for t in tasks) + len(self.sleepers) < len(tasks):
                await asyncio.sleep(0)  # a woken task runs until it sleeps again or ends
            if not self.sleepers:
                return
            wake, _, fut = heapq.heappop(self.sleepers)
            self.now = max(self.now, wake)
            fut.set_result(None)


def test_two_movers_together_get_the_rate_and_no_more(monkeypatch: pytest.MonkeyPatch) -> None:
    rate = 8 * 1024 * 1024  # 8 MiB/s
    burst = 64 * 1024
    vt = VirtualTime()
    monkeypatch.setattr(bucket_mod, "asyncio", types.SimpleNamespace(
        sleep=vt.sleep, CancelledError=asyncio.CancelledError))
    bucket = TokenBucket(rate, burst, clock=vt)
    moved = 0

    async def mover(request: int, until: float) -> None:
        nonlocal moved
        while vt() < until and moved < 10 * rate * until:  # (a bucket that never waits stops too)
            await bucket.acquire(request)  # larger than burst: split into chunks
            moved += request

    async def main() -> None:
        tasks = [asyncio.create_task(mover(200_000, 2.0)), asyncio.create_task(mover(30_000, 2.0))]
        await vt.drive(tasks)  # the tasks are owned here: drive() returns once both are done
        await asyncio.gather(*tasks)

    asyncio.run(main())
    assert vt.now >= 2.0
    achieved = (moved - burst) / vt.now  # the initial burst is free
    assert achieved == pytest.approx(rate, rel=1e-6), (achieved, rate, vt.now)
