"""The gateway's read threads: a batch's future settles once, after every call ended, with
each call's error; the loop is woken once per batch; a cancelled caller still waits for
its call; a closed loop does not kill a thread; close runs what was queued."""

from __future__ import annotations

import asyncio
import threading

import pytest

from services.storage_gateway.io_threads import IoThreads

pytestmark = pytest.mark.unit

HANG_GUARD_S = 60.0  # only a guard against a hung test, never a timing assertion


def test_a_batch_settles_once_after_every_call_with_each_error() -> None:
    threads = IoThreads(3, "t")
    release = threading.Event()
    ran: list[int] = []

    def slow() -> None:
        assert release.wait(HANG_GUARD_S)
        ran.append(0)

    def boom() -> None:
        ran.append(1)
        raise OSError("bad disk")

    async def main() -> list[BaseException | None]:
        loop = asyncio.get_running_loop()
        wakes = 0
        original = loop.call_soon_threadsafe

        def counting(*args: object, **kw: object):  # type: ignore[no-untyped-def]
            nonlocal wakes
            wakes += 1
            return original(*args, **kw)  # type: ignore[arg-type]

        loop.call_soon_threadsafe = counting  # type: ignore[method-assign]
        fut = threads.run_batch(loop, [slow, boom, lambda: ran.append(2)])
        while len(ran) < 2:  # boom and the third ran; slow still holds the batch open
            await asyncio.sleep(0.001)
        assert not fut.done()
        release.set()
        errors = await asyncio.wait_for(fut, HANG_GUARD_S)
        assert wakes == 1
        return errors

    errors = asyncio.run(main())
    assert errors[0] is None and errors[2] is None
    assert isinstance(errors[1], OSError)
    assert sorted(ran) == [0, 1, 2]
    threads.close()


def test_call_returns_the_value_or_raises_and_a_cancelled_caller_waits() -> None:
    threads = IoThreads(1, "t")
    started, release = threading.Event(), threading.Event()
    ended: list[bool] = []

    def held() -> None:
        started.set()
        assert release.wait(HANG_GUARD_S)
        ended.append(True)

    async def main() -> None:
        assert await threads.call(lambda a, b: a + b, 2, 3) == 5
        with pytest.raises(ValueError):
            await threads.call(int, "x")
        task = asyncio.create_task(threads.call(held))
        while not started.is_set():
            await asyncio.sleep(0.001)
        task.cancel()
        await asyncio.sleep(0)
        assert not task.done()  # still waiting for the thread
        release.set()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(task, HANG_GUARD_S)
        assert ended == [True]

    asyncio.run(main())
    threads.close()


def test_a_closed_loop_leaves_the_thread_serving_and_close_runs_what_was_queued() -> None:
    threads = IoThreads(1, "t")
    release = threading.Event()
    loop = asyncio.new_event_loop()
    threads.run_batch(loop, [lambda: release.wait(HANG_GUARD_S)])
    loop.close()  # nobody waits for that batch any more
    release.set()
    assert asyncio.run(threads.call(lambda: 7)) == 7  # the thread survived the closed loop
    done: list[int] = []
    loop = asyncio.new_event_loop()
    threads.run_batch(loop, [lambda: done.append(1), lambda: done.append(2)])
    threads.close()
    loop.close()
    assert done == [1, 2]
    loop = asyncio.new_event_loop()
    with pytest.raises(RuntimeError):
        threads.run_batch(loop, [lambda: None])
    loop.close()
