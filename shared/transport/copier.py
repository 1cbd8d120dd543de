"""Memory-to-memory copies, class-scheduled, off the event loop where it pays.

Owns `CopyWorker`: one thread per endpoint that drains a DrrScheduler of copy items
(each a list of (dst view, src view) pairs). It serves both `copy_local` (buffer <-> KV
memory, "H2D/D2H" on CPU) and the shm backend's peer copies. Large copies run through
numpy, which releases the GIL, so the loop stays responsive.

Latency copies up to LATENCY_INLINE (a layer of a batch of hit blocks) are never queued:
they run on the caller's thread at once, beside whatever bulk piece the worker is copying
(two cores, two copies), so a prefill's layer pull waits neither for bulk nor for a thread
wakeup (measured: shm one-block and layer pulls within +10% of idle under saturating
bulk, where a queued latency copy waited for the bulk piece in hand and the wakeup). The
loop is blocked for that copy: the TM is waiting for exactly it. A bulk (or larger)
transfer of at most INLINE_BYTES found with an idle worker is copied inline too.

Everything else is queued as few items as possible: its pairs are grouped, in order, into
items of at most ITEM bytes (a longer pair is cut), so 64 MiB in 682 scattered 96 KiB
pieces is 16 items, one contiguous 64 MiB copy 16 items, and the per-item cost (a lock,
a DRR pop) is paid 16 times, not once per piece or per 256 KiB. Latency items are copied
pair by pair. A bulk item is copied in pieces of at most SLICE bytes (a pair up to SLICE
is one piece): before every piece but the first of a turn, if latency work is queued, the
rest of the item goes back to the head of the BULK FIFO and the thread pops again, so a
queued latency transfer waits for one piece, not one item, and bulk still moves a piece
per turn.

Example: `await w.copy([(kv[0:96K], buf[0:96K]), ...], TrafficClass.BULK)`: the pairs
become items of <= 4 MiB in the BULK FIFO; the thread pops them in DRR order (99:1
against LATENCY), copies each pair (96 KiB <= SLICE: one numpy copy), checks the LATENCY
FIFO between pieces, and the last item's completion resolves the future on the loop via
call_soon_threadsafe. `await w.copy([(kv[0:1M], buf[0:1M])], TrafficClass.LATENCY)`
copies at once and returns.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence

import numpy as np

from .classes import CHUNK, DEFAULT_WEIGHTS, DrrScheduler

INLINE_BYTES = 64 << 10  # below this, with an idle worker, copy on the loop
LATENCY_INLINE = 4 << 20  # latency copies up to this run on the caller's thread, never queued
NUMPY_BYTES = 32 << 10  # at or above this, copy via numpy (GIL released)
SLICE = 128 << 10  # bulk moves in pieces of at most this (a layer block is one); queued latency preempts between
ITEM = 4 << 20  # a transfer is queued in items of at most this many bytes

Pair = tuple[memoryview, memoryview]  # (dst, src), equal lengths


def copy_pair(dst: memoryview, src: memoryview) -> None:
    if len(dst) >= NUMPY_BYTES:
        np.copyto(np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8))
    else:
        dst[:] = src


def group(pairs: Sequence[Pair], size: int = ITEM) -> list[list[Pair]]:
    """The pairs, in order, as items of at most `size` bytes (a longer pair is cut into several).

    Example (size 8): pairs of 3, 3, 3, 20 bytes -> [[3, 3], [3], [8], [8], [4]].
    """
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
    """One transfer: how many items are left and the future to resolve."""

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
    """A copy thread fed by a DRR scheduler (see module docstring)."""

    def __init__(self, weights: Sequence[int] = DEFAULT_WEIGHTS, name: str = "dp-copy") -> None:
        self._sched: DrrScheduler[Item] = DrrScheduler(weights, CHUNK)
        self._cond = threading.Condition()
        self._busy = False
        self._stop = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    async def copy(self, pairs: Sequence[Pair], cls: int) -> None:
        """Copy every (dst, src) pair; returns when all bytes landed."""
        total = sum(len(d) for d, _ in pairs)
        if (not cls and total <= LATENCY_INLINE) or (total <= INLINE_BYTES and self._idle()):
            for dst, src in pairs:
                copy_pair(dst, src)
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
            for cls, (pairs, job) in batch:
                exc = None
                try:
                    if job.fut.done():  # failed (or its waiter left): skip the rest
                        pass
                    elif cls:
                        if not self._bulk(cls, pairs, job):
                            continue  # preempted: the rest is queued again, the item is not done
                    else:
                        for dst, src in pairs:
                            copy_pair(dst, src)
                except Exception as e:  # a bad view: fail the transfer, keep the worker
                    exc = e
                self._done(job, exc)
            del batch, pairs, job  # drop views now: lets shm regions unmap on close

    def _bulk(self, cls: int, pairs: list[Pair], job: _Job) -> bool:
        """Copy a bulk item piece by piece; False if latency work took over (the rest requeued)."""
        latency = self._sched.queued
        first = True
        for i, (dst, src) in enumerate(pairs):
            n = len(dst)
            if n <= SLICE:
                if not first and latency(0):
                    return self._requeue(cls, pairs[i:], job)
                copy_pair(dst, src)
                first = False
                continue
            d, s = np.frombuffer(dst, np.uint8), np.frombuffer(src, np.uint8)  # sliced below: no view per piece
            for off in range(0, n, SLICE):
                if not first and latency(0):
                    del d, s
                    return self._requeue(cls, [(dst[off:], src[off:]), *pairs[i + 1 :]], job)
                np.copyto(d[off : off + SLICE], s[off : off + SLICE])
                first = False
        return True

    def _requeue(self, cls: int, rest: list[Pair], job: _Job) -> bool:
        with self._cond:
            self._sched.push_front(cls, (rest, job), sum(len(d) for d, _ in rest))
        return False

    @staticmethod
    def _done(job: _Job, exc: BaseException | None) -> None:
        job.left -= 1
        if job.left == 0 or exc is not None:
            try:
                job.loop.call_soon_threadsafe(_resolve, job.fut, exc)
            except RuntimeError:  # loop closed under us
                pass
