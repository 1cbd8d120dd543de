"""Asyncio helpers the backends share: a task owner and a transfer deadline."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Coroutine
from typing import Any

from .errors import TransferTimeout

DEFAULT_TIMEOUT = 30.0


class TaskOwner:
    """Holds strong references to tasks it started; `aclose` cancels and awaits them."""

    def __init__(self) -> None:
        self._tasks: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str = "") -> asyncio.Task[Any]:
        task = asyncio.get_running_loop().create_task(coro, name=name or None)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        return task

    async def aclose(self) -> None:
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


@contextlib.asynccontextmanager
async def deadline(timeout: float | None, peer: str, nbytes: int) -> AsyncIterator[None]:
    """`async with deadline(t, peer, n):` raises TransferTimeout(peer, t, n) on expiry."""
    t = DEFAULT_TIMEOUT if timeout is None else timeout
    try:
        async with asyncio.timeout(t):
            yield
    except TimeoutError:
        raise TransferTimeout(peer, t, nbytes) from None
