"""Token bucket that emulates a storage NIC's bandwidth (one for reads, one for writes).

``reserve`` may go into debt and returns the wait, so callers are served FIFO without a lock;
``rate=None`` is unlimited."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable


def gbps_to_bytes(gbps: float) -> float:
    return gbps * 1e9 / 8


class TokenBucket:
    """Rate limit in bytes/s with a burst allowance of ``burst_bytes``."""

    def __init__(
        self,
        rate_bytes_per_s: float | None,
        burst_bytes: int | None = None,
        *,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        if rate_bytes_per_s is not None and rate_bytes_per_s <= 0:
            raise ValueError("rate_bytes_per_s must be > 0 (or None: unlimited)")
        self.rate = rate_bytes_per_s
        default_burst = int(rate_bytes_per_s * 0.01) if rate_bytes_per_s else 1
        self.burst = max(1, burst_bytes if burst_bytes is not None else default_burst)
        self._clock = clock
        self._tokens = float(self.burst)
        self._last = clock()

    @classmethod
    def from_gbps(cls, gbps: float | None, burst_s: float = 0.01) -> TokenBucket:
        """A bucket for a link of ``gbps`` Gbit/s (None or 0: unlimited)."""
        if not gbps:
            return cls(None)
        rate = gbps_to_bytes(gbps)
        return cls(rate, max(1, int(rate * burst_s)))

    @property
    def unlimited(self) -> bool:
        return self.rate is None

    # ----- pure core (clock passed in) ---------------------------------------
    def _refill(self, now: float) -> None:
        assert self.rate is not None
        elapsed = max(0.0, now - self._last)
        self._tokens = min(float(self.burst), self._tokens + elapsed * self.rate)
        self._last = max(self._last, now)

    def time_to_ready(self, nbytes: int, now: float | None = None) -> float:
        """Seconds until ``nbytes`` (<= burst) could be taken without waiting."""
        if self.rate is None:
            return 0.0
        self._refill(self._clock() if now is None else now)
        return max(0.0, (min(nbytes, self.burst) - self._tokens) / self.rate)

    def try_acquire(self, nbytes: int, now: float | None = None) -> bool:
        """Take ``nbytes`` if available now, never into debt (at most ``burst``)."""
        if self.rate is None:
            return True
        if nbytes > self.burst or self.time_to_ready(nbytes, now) > 0.0:
            return False
        self._tokens -= nbytes
        return True

    def reserve(self, nbytes: int, now: float | None = None) -> float:
        """Take ``nbytes`` now, possibly into debt; returns the wait in seconds."""
        if self.rate is None:
            return 0.0
        self._refill(self._clock() if now is None else now)
        self._tokens -= nbytes
        return max(0.0, -self._tokens / self.rate)

    def refund(self, nbytes: int) -> None:
        if self.rate is not None:
            self._tokens = min(float(self.burst), self._tokens + nbytes)

    # ----- asyncio wrapper ---------------------------------------------------
    async def acquire(self, nbytes: int) -> None:
        """Wait until ``nbytes`` may move, in chunks of at most ``burst``."""
        if self.rate is None:
            return
        left = nbytes
        while left > 0:
            chunk = min(left, self.burst)
            delay = self.reserve(chunk)
            if delay > 0:
                try:
                    await asyncio.sleep(delay)
                except asyncio.CancelledError:
                    self.refund(chunk)
                    raise
            left -= chunk
