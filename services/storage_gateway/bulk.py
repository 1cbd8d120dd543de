"""The node's bulk read lane: prefetch reads go only while no latency read is pending.

A bulk read that started delays a later latency read by its own bytes at most."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator


class BulkLane:
    def __init__(self) -> None:
        self.latency = 0  # latency reads accepted, not finished
        self.waiting = 0  # bulk reads waiting for the lane
        self._idle: asyncio.Event | None = None

    def _event(self) -> asyncio.Event:
        if self._idle is None:
            self._idle = asyncio.Event()
            if self.latency == 0:
                self._idle.set()
        return self._idle

    @contextlib.contextmanager
    def latency_read(self) -> Iterator[None]:
        """A latency read runs for as long as the block does; bulk reads wait meanwhile."""
        self.latency += 1
        self._event().clear()
        try:
            yield
        finally:
            self.latency -= 1
            if self.latency == 0:
                self._event().set()

    async def wait_turn(self, within_s: float = 0.0) -> bool:
        """True once no latency read is pending; False when that took longer than `within_s` (0: no limit)."""
        self.waiting += 1
        try:
            if within_s > 0:
                await asyncio.wait_for(self._wait(), within_s)
            else:
                await self._wait()
            return True
        except TimeoutError:
            return False
        finally:
            self.waiting -= 1

    async def _wait(self) -> None:
        while self.latency:
            await self._event().wait()
