"""Traffic classes on a software-scheduled link (tcp, shm): deficit round robin over bytes."""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Generic, TypeVar

from .gate import BulkGate

T = TypeVar("T")
CHUNK = 256 << 10
# Bulk moves in smaller pieces: a latency frame that arrives while a bulk piece is being
# sent (or received) waits for that piece: ~40-60 us of loopback copy for 128 KiB against
# ~80-120 us for 256 KiB. Measured on loopback (64 MiB in 96 KiB ops, tcp/raw socket
# time): 64 KiB pieces 3.7-4.1x, 128 KiB 2.6-2.9x, 256 KiB 2.3-2.6x.
BULK_CHUNK = 128 << 10
DEFAULT_WEIGHTS = (99, 1)
# A batch of an initiator's bulk-only socket while no latency work is open on the endpoint
# (tcp_send.py): several pieces per sendmsg; once latency opens, batches are BULK_CHUNK.
BULK_BATCH = 512 << 10


def chunk_for(cls: int) -> int:
    """The largest frame of class `cls` (0 latency, 1 bulk) on a software-scheduled link."""
    return CHUNK if not cls else BULK_CHUNK


def split(offset: int, length: int, chunk: int = CHUNK) -> list[tuple[int, int]]:
    if length <= chunk:
        return [(offset, length)]
    return [(offset + o, min(chunk, length - o)) for o in range(0, length, chunk)]


class DrrScheduler(Generic[T]):
    """Deficit round robin across classes 0..n-1 over bytes; a class with nothing queued banks no credit."""

    def __init__(self, weights: Sequence[int] = DEFAULT_WEIGHTS, quantum: int = CHUNK) -> None:
        if not weights or any(w <= 0 for w in weights):
            raise ValueError(f"weights must be positive, got {weights!r}")
        self._quantum = [w * quantum for w in weights]
        self._queues: list[deque[tuple[T, int]]] = [deque() for _ in weights]
        self._deficit = [0] * len(weights)
        self._cur = 0
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def push(self, cls: int, item: T, nbytes: int) -> None:
        self._queues[cls].append((item, nbytes))
        self._count += 1

    def push_front(self, cls: int, item: T, nbytes: int) -> None:
        self._queues[cls].appendleft((item, nbytes))
        self._count += 1

    def pop_class(self, cls: int, max_bytes: int) -> list[tuple[int, T]]:
        """Pop FIFO items of one class up to `max_bytes` (at least one), outside DRR order."""
        q, out, total = self._queues[cls], [], 0
        while q and (not out or total + q[0][1] <= max_bytes):
            item, nbytes = q.popleft()
            self._count -= 1
            total += nbytes
            out.append((cls, item))
        return out

    def queued(self, cls: int) -> int:
        return len(self._queues[cls])

    def pop(self) -> tuple[int, T] | None:
        if not self._count:
            return None
        while True:
            q = self._queues[self._cur]
            if q and self._deficit[self._cur] >= q[0][1]:
                return self._take(self._cur)
            if not q:
                self._deficit[self._cur] = 0  # idle classes bank no credit
            self._cur = (self._cur + 1) % len(self._queues)
            if self._queues[self._cur]:
                self._deficit[self._cur] += self._quantum[self._cur]

    def pop_batch(self, max_bytes: int) -> list[tuple[int, T]]:
        """Pop in DRR order until `max_bytes` would be exceeded (always at least one)."""
        out: list[tuple[int, T]] = []
        total = 0
        while self._count:
            nxt = self._peek_size()
            if out and total + nxt > max_bytes:
                break
            got = self.pop()
            assert got is not None
            out.append(got)
            total += nxt
        return out

    def _peek_size(self) -> int:
        for i in range(len(self._queues)):
            q = self._queues[(self._cur + i) % len(self._queues)]
            if q:
                return q[0][1]
        return 0

    def _take(self, cls: int) -> tuple[int, T]:
        item, nbytes = self._queues[cls].popleft()
        self._deficit[cls] -= nbytes
        self._count -= 1
        if not self._queues[cls]:
            self._deficit[cls] = 0
        return cls, item


class LinkGate:
    """The asyncio face of a `BulkGate` shared by every link of one endpoint: latency work brackets
    itself with `open()` / `close()`, a bulk frame first awaits `bulk_turn(n)`."""

    def __init__(self, weights: Sequence[int] = DEFAULT_WEIGHTS) -> None:
        self.policy = BulkGate(weights)
        self._changed = asyncio.Event()

    def open(self) -> None:
        self.policy.open()

    def close(self) -> None:
        self.policy.close()
        if not self.policy.busy:
            self._changed.set()

    def served(self, nbytes: int) -> None:
        self.policy.served(nbytes)
        self._changed.set()

    def poke(self) -> None:
        self._changed.set()

    async def bulk_turn(self, nbytes: int, preempt: Callable[[], bool] | None = None) -> bool:
        """Wait until a bulk frame of `nbytes` may move (True), or `preempt()` is true (False)."""
        while not self.policy.admit(nbytes, time.monotonic()):
            if preempt is not None and preempt():
                return False
            self._changed.clear()
            try:
                async with asyncio.timeout(self.policy.wait_hint(time.monotonic())):
                    await self._changed.wait()
            except TimeoutError:
                pass
        return True


class ClassSender(Generic[T]):
    """Drains a DrrScheduler onto one link through `emit(batch)`: `submit` never blocks, `run` is the
    worker; if `emit` raises, `on_error` gets it and the sender stops. With a `gate`, a batch holding
    bulk first awaits its turn, and `submit(..., hold=True)` keeps the gate open until the item is sent."""

    def __init__(
        self,
        emit: Callable[[list[T]], Awaitable[None]],
        weights: Sequence[int] = DEFAULT_WEIGHTS,
        batch_bytes: int = CHUNK,
        on_error: Callable[[BaseException], None] | None = None,
        gate: LinkGate | None = None,
        send_now: Callable[[T], T | None] | None = None,
    ) -> None:
        self._sched: DrrScheduler[tuple[T, bool, int]] = DrrScheduler(weights, CHUNK)
        self._emit = emit
        self._send_now = send_now  # sends what the link takes at once, returns the rest (None: all)
        self._emitting = False
        self._batch_bytes = batch_bytes
        self._on_error = on_error
        self._gate = gate
        self._wake = asyncio.Event()

    def submit(self, cls: int, item: T, nbytes: int, *, hold: bool = False) -> None:
        if not cls and self._send_now is not None and not self._emitting and not len(self._sched):
            # an idle link: a latency item goes out now, not one loop turn later (the rest, if
            # the socket took only part of it, is queued first in line)
            try:
                rest = self._send_now(item)
            except OSError as exc:
                rest = None
                if self._on_error is not None:
                    self._on_error(exc)
            if rest is None:
                if self._gate is not None:
                    self._gate.served(nbytes)
                return
            hold = hold and self._gate is not None
            if hold:
                self._gate.open()  # type: ignore[union-attr]
            self._sched.push_front(cls, (rest, hold, nbytes), nbytes)
            self._wake.set()
            return
        hold = hold and self._gate is not None
        if hold:
            self._gate.open()  # type: ignore[union-attr]
        self._sched.push(cls, (item, hold, nbytes), nbytes)
        self._wake.set()
        if not cls and self._gate is not None:
            self._gate.poke()  # a bulk batch of this link held at the gate lets it pass

    def submit_many(self, cls: int, frames: list[tuple[T, int]]) -> None:
        for item, nbytes in frames:
            self.submit(cls, item, nbytes)

    async def run(self) -> None:
        try:
            while True:
                if not len(self._sched):
                    self._wake.clear()
                    await self._wake.wait()
                limit = self._batch_bytes if self._sched.queued(0) else min(self._batch_bytes, BULK_CHUNK)
                if not await self._send(self._sched.pop_batch(limit)):
                    return
                await asyncio.sleep(0)
        finally:
            while (got := self._sched.pop()) is not None:  # never sent: release their holds
                if got[1][1]:
                    self._gate.close()  # type: ignore[union-attr]

    async def _send(self, batch: list[tuple[int, tuple[T, bool, int]]]) -> bool:
        gate = self._gate
        if gate is not None and any(c for c, _ in batch):
            if not all(c for c, _ in batch):  # mixed: latency goes first, bulk may wait
                if not await self._send([x for x in batch if not x[0]]):
                    return False
                batch = [x for x in batch if x[0]]
            nbulk = sum(n for c, (_, _, n) in batch if c)
            # latency items of this link never wait behind a held bulk batch
            while not await gate.bulk_turn(nbulk, lambda: self._sched.queued(0) > 0):
                if not await self._send(self._sched.pop_class(0, self._batch_bytes)):
                    return False
        try:
            self._emitting = True
            await self._emit([item for _, (item, _, _) in batch])
            return True
        except Exception as exc:  # the link is broken: report once, stop
            if self._on_error is not None:
                self._on_error(exc)
            return False
        finally:
            self._emitting = False
            if gate is not None:
                gate.served(sum(n for c, (_, _, n) in batch if not c))
                for _ in range(sum(1 for _, (_, h, _) in batch if h)):
                    gate.close()
