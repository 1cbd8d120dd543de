"""Memory-to-memory copies, class-scheduled, off the event loop where it pays."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Sequence

import numpy as np

from .classes import CHUNK, DEFAULT_WEIGHTS, DrrScheduler
from .copy_share import SLICE, Pair, SharedCopy, View, cut

INLINE_BYTES = 64 << 10  # below this, with an idle worker, copy on the loop
LATENCY_INLINE = 4 << 20  # latency copies up to this run on the caller's thread, never queued
NUMPY_BYTES = 32 << 10  # at or above this, copy via numpy (GIL released)
ITEM = 4 << 20  # a transfer is queued in items (bulk: tokens) of at most this many bytes
LOOP_TURN = 2 << 20  # a helping caller yields to its loop after this many bytes (~0.4 ms of copy)
LATENCY_QUIET = 0.05  # the caller copies bulk only if it made no latency copy in this many seconds
LOOP_BUSY = 200e-6  # the loop's other tasks took this much CPU in one turn of a helping caller: the worker joins

__all__ = ["SLICE", "CopyWorker", "Pair", "copy_pair", "group"]


def copy_pair(dst: View, src: View) -> None:
    """Copy src into dst (memoryviews or 1-d uint8 arrays); large copies release the GIL."""
    if type(dst) is np.ndarray:
        if len(dst) != len(src):  # never broadcast a short source
            raise ValueError(f"copy of {len(src)} bytes into {len(dst)}")
        dst[...] = src
    elif len(dst) >= NUMPY_BYTES:
        np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))
    else:
        dst[:] = src  # type: ignore[assignment]  # a small array source is a buffer too


def group(pairs: Sequence[Pair], size: int = ITEM) -> list[list[Pair]]:
    out: list[list[Pair]] = []
    cur: list[Pair] = []
    n = 0
    for d, s in pairs:
        length = len(d)
        if length > size:
            if cur:
                out.append(cur)
                cur, n = [], 0
            out.extend([(d[o : o + size], s[o : o + size])] for o in range(0, length, size))
            continue
        if n + length > size and cur:
            out.append(cur)
            cur, n = [], 0
        cur.append((d, s))
        n += length
    if cur:
        out.append(cur)
    return out


class _Job:
    __slots__ = ("left", "fut", "loop")

    def __init__(self, left: int, fut: asyncio.Future[None], loop: asyncio.AbstractEventLoop) -> None:
        self.left = left
        self.fut = fut
        self.loop = loop


def _resolve(fut: asyncio.Future[None], exc: BaseException | None) -> None:
    if fut.done():
        return
    if exc is None:
        fut.set_result(None)
    else:
        fut.set_exception(exc)


Item = tuple[list[Pair], _Job]


class CopyWorker:
    """A copy thread per endpoint fed by a DRR scheduler. Small latency copies run inline on the
    caller's thread; a bulk transfer is copied by the caller while its loop has no latency work,
    the thread joining from the back when the loop is busy and taking the rest when latency shows up."""

    def __init__(self, weights: Sequence[int] = DEFAULT_WEIGHTS, name: str = "dp-copy",
                 caller_copies: bool = True) -> None:
        self._sched: DrrScheduler[Item | tuple[int, SharedCopy]] = DrrScheduler(weights, CHUNK)
        self._cond = threading.Condition()
        self._busy = False
        self._stop = False
        self._caller_copies = caller_copies
        self._latency_at = -LATENCY_QUIET  # when copy() last saw a latency transfer (monotonic)
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def copy(self, pairs: Sequence[Pair], cls: int, nbytes: int | None = None) -> None:
        """Copy every (dst, src) pair (`nbytes` in all, if the caller knows); returns when all bytes landed."""
        total = sum(len(d) for d, _ in pairs) if nbytes is None else nbytes
        if not cls:
            self._latency_at = time.monotonic()
        if (not cls and total <= LATENCY_INLINE) or (total <= INLINE_BYTES and self._idle()):
            for dst, src in pairs:
                copy_pair(dst, src)
            return
        if cls:
            await self._shared(pairs, cls, total)
            return
        items = group([p for p in pairs if len(p[0])])
        if not items:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        job = _Job(len(items), fut, loop)
        with self._cond:
            if self._stop:
                raise RuntimeError("copy worker closed")
            for it in items:
                self._sched.push(cls, (it, job), sum(len(d) for d, _ in it))
            self._cond.notify()
        await fut

    async def _shared(self, pairs: Sequence[Pair], cls: int, total: int) -> None:
        if self._stop:
            raise RuntimeError("copy worker closed")
        helping = self._caller_copies and self._quiet()
        pieces = cut(pairs, LOOP_TURN if helping else SLICE)  # a long pair: one piece per caller turn
        if not pieces:
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        job = SharedCopy(pieces, fut, loop, helping)
        if not job.helping:
            self._tokens(cls, job, total, True)
        try:
            if job.helping and await self._help(cls, job):
                if job.exc is not None:
                    raise job.exc
                return
            await fut
        finally:
            if not fut.done():  # cancelled (a deadline): the worker claims nothing more
                job.abandon()
                fut.cancel()

    def _tokens(self, cls: int, job: SharedCopy, nbytes: int, first: bool = False) -> None:
        with self._cond:
            if self._stop:
                if first:
                    raise RuntimeError("copy worker closed")
                return
            for off in range(0, nbytes, ITEM):
                n = min(ITEM, nbytes - off)
                self._sched.push(cls, (n, job), n)
            self._cond.notify()

    def _quiet(self) -> bool:
        return time.monotonic() - self._latency_at >= LATENCY_QUIET

    async def _help(self, cls: int, job: SharedCopy) -> bool:
        """Copy `job` in order here, LOOP_TURN bytes a loop turn; True if this thread completed it, False
        if the worker will (latency work showed up, or it holds the last pieces in flight)."""
        enlisted = False
        while True:
            if not self._quiet():
                if left := job.unclaimed(False):
                    self._tokens(cls, job, left)
                return False
            got = job.caller_claim(LOOP_TURN)
            if not got:
                return False
            exc = None
            try:
                for dst, src in got:
                    copy_pair(dst, src)
            except Exception as e:  # a bad view: fail the transfer
                exc = e
            n = len(got)
            del got
            if job.finish(exc, n):
                return True
            t = time.thread_time()  # CPU, not wall: a loop preempted by other processes is not busy
            await asyncio.sleep(0)
            if not enlisted and time.thread_time() - t >= LOOP_BUSY:  # the loop has other work too
                enlisted = True
                if left := job.unclaimed(True):
                    self._tokens(cls, job, left)

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify()
        self._thread.join(timeout=5)

    def _idle(self) -> bool:
        with self._cond:
            return not self._busy and not len(self._sched)

    def _run(self) -> None:
        while True:
            with self._cond:
                while not len(self._sched) and not self._stop:
                    self._busy = False
                    self._cond.wait()
                if self._stop:
                    return
                self._busy = True
                batch = self._sched.pop_batch(CHUNK)  # an item over CHUNK comes alone
            for cls, (what, job) in batch:
                if isinstance(job, SharedCopy):
                    self._claim(cls, what, job)  # type: ignore[arg-type]
                    continue
                exc = None
                try:
                    if not job.fut.done():  # failed (or its waiter left): skip the rest
                        for dst, src in what:  # type: ignore[union-attr]
                            copy_pair(dst, src)
                except Exception as e:  # a bad view: fail the transfer, keep the worker
                    exc = e
                self._done(job, exc)
            del batch, what, job  # drop views now: lets shm regions unmap on close

    def _claim(self, cls: int, budget: int, job: SharedCopy) -> None:
        """Copy up to `budget` bytes of `job`'s pieces from the back; with latency work queued before a
        piece, the rest of the token goes back to the head of the FIFO."""
        first = True
        while budget > 0:
            if not first and self._sched.queued(0):
                with self._cond:
                    self._sched.push_front(cls, (budget, job), budget)
                return
            p = job.worker_claim()
            if p is None:  # nothing left, or the rest is the helping caller's
                return
            exc = None
            try:
                copy_pair(*p)
            except Exception as e:  # a bad view: fail the transfer, keep the worker
                exc = e
            first = False
            budget -= len(p[0])
            del p
            if job.finish(exc):
                self._resolve_soon(job.fut, job.loop, job.exc)
                return

    @staticmethod
    def _done(job: _Job, exc: BaseException | None) -> None:
        job.left -= 1
        if job.left == 0 or exc is not None:
            CopyWorker._resolve_soon(job.fut, job.loop, exc)

    @staticmethod
    def _resolve_soon(fut: asyncio.Future[None], loop: asyncio.AbstractEventLoop, exc: BaseException | None) -> None:
        try:
            loop.call_soon_threadsafe(_resolve, fut, exc)
        except RuntimeError:  # loop closed under us
            pass
