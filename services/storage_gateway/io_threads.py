"""The gateway's read threads, fed by one queue; a batch of calls settles one future.

A batch costs the event loop one put per call and one wake-up."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Sequence
from queue import SimpleQueue
from typing import Any

_STOP = None


class _Batch:
    __slots__ = ("loop", "fut", "left", "errors", "lock")

    def __init__(self, loop: asyncio.AbstractEventLoop, fut: asyncio.Future, n: int) -> None:
        self.loop, self.fut, self.left = loop, fut, n
        self.errors: list[BaseException | None] = [None] * n
        self.lock = threading.Lock()

    def done(self, i: int, error: BaseException | None) -> None:
        self.errors[i] = error
        with self.lock:
            self.left -= 1
            last = self.left == 0
        if last:
            try:
                self.loop.call_soon_threadsafe(_settle, self.fut, self.errors)
            except RuntimeError:  # the loop is closed: nobody waits any more
                pass


def _settle(fut: asyncio.Future, errors: list[BaseException | None]) -> None:
    if not fut.done():
        fut.set_result(errors)


class IoThreads:
    def __init__(self, n: int, name: str) -> None:
        self._queue: SimpleQueue[Any] = SimpleQueue()
        self._threads = [threading.Thread(target=self._work, name=f"{name}_{i}", daemon=True) for i in range(n)]
        self._closed = False
        for t in self._threads:
            t.start()

    def _work(self) -> None:
        get = self._queue.get
        while (item := get()) is not _STOP:
            batch, i, call = item
            try:
                call()
                batch.done(i, None)
            except BaseException as exc:  # noqa: BLE001 - handed to the awaiting loop
                batch.done(i, exc)

    def run_batch(self, loop: asyncio.AbstractEventLoop, calls: Sequence[Callable[[], None]]) -> asyncio.Future:
        """Queue ``calls``; the future's result is their errors (None each that returned)."""
        if self._closed:
            raise RuntimeError("IoThreads closed")
        fut = loop.create_future()
        batch = _Batch(loop, fut, len(calls))
        put = self._queue.put
        for i, call in enumerate(calls):
            put((batch, i, call))
        return fut

    async def call(self, fn: Callable[..., Any], *args: object) -> Any:
        """``fn(*args)`` on a thread; if cancelled, waits for it before re-raising."""
        out: list[Any] = []
        fut = self.run_batch(asyncio.get_running_loop(), [lambda: out.append(fn(*args))])
        try:
            errors = await asyncio.shield(fut)
        except asyncio.CancelledError:
            await asyncio.wait([fut])
            raise
        if errors[0] is not None:
            raise errors[0]
        return out[0]

    def close(self) -> None:
        """Stop after the calls already queued."""
        if self._closed:
            return
        self._closed = True
        for _ in self._threads:
            self._queue.put(_STOP)
        for t in self._threads:
            t.join()
