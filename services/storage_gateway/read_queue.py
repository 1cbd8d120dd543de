"""The node's read queue: storage reads accepted but not finished, in blocks and bytes.

Pure accounting: no I/O, no asyncio."""

from __future__ import annotations

import time
from collections.abc import Callable

import msgspec


class ReadQueueSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    pending_blocks: int  # blocks accepted and not yet finished
    pending_bytes: int
    pending_requests: int
    enqueued_blocks: int  # totals since start
    enqueued_bytes: int
    done_blocks: int
    done_bytes: int
    peak_pending_bytes: int
    busy_s: float  # time with at least one block pending (for utilisation)


class ReadQueue:
    """Counters of pending reads; ``check_integrity`` holds after every call."""

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self.pending_blocks = 0
        self.pending_bytes = 0
        self.pending_requests = 0
        self.enqueued_blocks = 0
        self.enqueued_bytes = 0
        self.done_blocks = 0
        self.done_bytes = 0
        self.peak_pending_bytes = 0
        self._busy_s = 0.0
        self._busy_since: float | None = None

    @property
    def idle(self) -> bool:
        return self.pending_blocks == 0

    def enqueue(self, blocks: int, nbytes: int) -> None:
        if self._busy_since is None and blocks > 0:
            self._busy_since = self._clock()
        self.pending_requests += 1
        self.pending_blocks += blocks
        self.pending_bytes += nbytes
        self.enqueued_blocks += blocks
        self.enqueued_bytes += nbytes
        self.peak_pending_bytes = max(self.peak_pending_bytes, self.pending_bytes)

    def dequeue(self, blocks: int, nbytes: int) -> None:
        """``blocks`` blocks of an accepted request finished (any outcome)."""
        if blocks > self.pending_blocks or nbytes > self.pending_bytes:
            raise ValueError("dequeue of more than is pending")
        self.pending_blocks -= blocks
        self.pending_bytes -= nbytes
        self.done_blocks += blocks
        self.done_bytes += nbytes
        if self.pending_blocks == 0 and self._busy_since is not None:
            self._busy_s += self._clock() - self._busy_since
            self._busy_since = None

    def finish_request(self) -> None:
        if self.pending_requests <= 0:
            raise ValueError("finish_request with no request pending")
        self.pending_requests -= 1

    def snapshot(self) -> ReadQueueSnapshot:
        busy = self._busy_s
        if self._busy_since is not None:
            busy += self._clock() - self._busy_since
        return ReadQueueSnapshot(
            pending_blocks=self.pending_blocks,
            pending_bytes=self.pending_bytes,
            pending_requests=self.pending_requests,
            enqueued_blocks=self.enqueued_blocks,
            enqueued_bytes=self.enqueued_bytes,
            done_blocks=self.done_blocks,
            done_bytes=self.done_bytes,
            peak_pending_bytes=self.peak_pending_bytes,
            busy_s=busy,
        )

    def check_integrity(self) -> None:
        assert self.pending_blocks >= 0 and self.pending_bytes >= 0
        assert self.pending_requests >= 0
        assert self.enqueued_blocks - self.done_blocks == self.pending_blocks
        assert self.enqueued_bytes - self.done_bytes == self.pending_bytes
        assert self.pending_blocks == 0 or self._busy_since is not None
