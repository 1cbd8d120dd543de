"""Memory-to-memory copies, class-scheduled, off the event loop.

Owns `CopyWorker`: one thread per endpoint that drains a DrrScheduler of copy chunks
(dst view, src view). It serves both `copy_local` (buffer <-> KV memory, "H2D/D2H" on
CPU) and the shm backend's peer copies. Large copies run through numpy, which releases
the GIL, so the loop stays responsive; a small transfer found with an idle worker is
copied inline (no thread hop).

Example: `await w.copy([(kv[0:96K], buf[0:96K]), ...], TrafficClass.LATENCY)`:
the pairs are cut into <= CHUNK pieces, queued in the LATENCY FIFO, the thread pops
them in DRR order (99:1 against BULK), and the last piece's completion resolves the
future on the loop via call_soon_threadsafe. A bulk chunk is copied in SLICE pieces; if
latency work is queued between two slices, the rest of the chunk goes back to the head
of the BULK FIFO and the thread pops again (latency waits for one slice, not one chunk).
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np

from .classes import CHUNK, DEFAULT_WEIGHTS, DrrScheduler, split

INLINE_BYTES = 64 << 10  # below this, with an idle worker, copy on the loop
NUMPY_BYTES = 32 << 10  # at or above this, copy via numpy (GIL released)
SLICE = 64 << 10  # a bulk chunk is copied in slices; latency work preempts between them

Pair = tuple[memoryview, memoryview]  # (dst, src), equal lengths


def copy_pair(dst: memoryview, src: memoryview) -> None:
    if len(dst) >= NUMPY_BYTES:
        np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))
    else:
        dst[:] = src


class _Job:
    """One transfer: how many chunks are left and the future to resolve."""

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


class CopyWorker:
    """A copy thread fed by a DRR scheduler (see module docstring)."""

    def __init__(self, weights: Sequence[int] = DEFAULT_WEIGHTS, name: str = "dp-copy") -> None:
        self._sched: DrrScheduler[tuple[memoryview, memoryview, _Job]] = DrrScheduler(weights, CHUNK)
        self._cond = threading.Condition()
        self._busy = False
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def copy(self, pairs: Sequence[Pair], cls: int) -> None:
        """Copy every (dst, src) pair; returns when all bytes landed."""
        total = sum(len(d) for d, _ in pairs)
        if total <= INLINE_BYTES and self._idle():
            for dst, src in pairs:
                copy_pair(dst, src)
            return
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        chunks = [(d[o : o + n], s[o : o + n]) for d, s in pairs for o, n in split(0, len(d))]
        if not chunks:
            return
        job = _Job(len(chunks), fut, loop)
        with self._cond:
            if self._stop:
                raise RuntimeError("copy worker closed")
            for d, s in chunks:
                self._sched.push(cls, (d, s, job), len(d))
            self._cond.notify()
        await fut

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
                batch = self._sched.pop_batch(CHUNK)
            for cls, (dst, src, job) in batch:
                if cls and len(dst) > SLICE:
                    self._bulk(cls, dst, src, job)
                else:
                    self._one(dst, src, job)
            del batch, dst, src, job  # drop views now: lets shm regions unmap on close

    def _bulk(self, cls: int, dst: memoryview, src: memoryview, job: _Job) -> None:
        """Copy a bulk chunk slice by slice; if latency work is queued, requeue the rest."""
        done = 0
        try:
            d, s = np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8)  # sliced below: no view per slice
        except Exception:  # a bad view: let _one fail the job
            return self._one(dst, src, job)
        while len(dst) - done > SLICE:
            if self._sched.queued(0) and not job.fut.done():
                with self._cond:
                    self._sched.push_front(cls, (dst[done:], src[done:], job), len(dst) - done)
                return
            try:
                np.copyto(d[done : done + SLICE], s[done : done + SLICE])
            except Exception:  # a bad view: let _one fail the job
                break
            done += SLICE
        del d, s
        self._one(dst[done:], src[done:], job)

    def _one(self, dst: memoryview, src: memoryview, job: _Job) -> None:
        exc: BaseException | None = None
        try:
            if not job.fut.done():
                copy_pair(dst, src)
        except Exception as e:  # a bad view: fail the transfer, keep the worker
            exc = e
        job.left -= 1
        if job.left == 0 or exc is not None:
            try:
                job.loop.call_soon_threadsafe(_resolve, job.fut, exc)
            except RuntimeError:  # loop closed under us
                pass

