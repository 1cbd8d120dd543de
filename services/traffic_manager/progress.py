"""Where a traffic-manager keeps track of the layers of a request: read, computed, and pushed on.

A wait's deadline runs from the entry's last progress, so a slow but moving peer never fails a
request and a silent one is given up on. Pure asyncio, no I/O."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass


class Stalled(LookupError):
    """A wait saw no progress within its deadline."""


class Waitable:
    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.error = ""
        self.holders = 0
        self.born = self.moved = time.monotonic()  # moved: the last progress (a `note`)

    def note(self) -> None:
        self.moved = time.monotonic()
        self.changed.set()

    def fail(self, error: str) -> None:
        self.error = self.error or error
        self.changed.set()

    async def until(self, ready: Callable[[], bool], timeout: float, what: str) -> None:
        """Wait until `ready()`; Stalled once nothing moved for `timeout`, RuntimeError when failed."""
        start = time.monotonic()
        while not ready():
            if self.error:
                raise RuntimeError(self.error)
            left = max(start, self.moved) + timeout - time.monotonic()
            if left <= 0:
                raise Stalled(f"{what} not within {timeout:g} s of the last progress")
            self.changed.clear()
            try:
                await asyncio.wait_for(self.changed.wait(), left)
            except asyncio.TimeoutError:
                pass


@dataclass(eq=False)
class ReadTrack(Waitable):
    opened: int | None = None  # blocks found (None: not opened yet)
    eta_s: float = 0.0
    layers: int = 0
    final: int | None = None  # blocks verified (None: the reply is not in yet)
    final_error: str = ""

    def __post_init__(self) -> None:
        Waitable.__init__(self)

    def has(self, layer: int, last: bool) -> bool:
        """Layer `layer` is in the buffer; the `last` one only once the read is over and verified."""
        return self.final is not None or (not last and self.layers > layer)

    def finish(self, blocks: int, error: str = "") -> None:
        self.final, self.final_error = blocks, error
        if self.opened is None:
            self.opened = blocks
        self.note()


@dataclass(eq=False)
class LayerState(Waitable):
    computed: int = 0  # layers 0..computed-1 have their KV written by the engine
    pushed: int = 0  # layers 0..pushed-1 have landed in the DE buffer
    window: int = 0  # a fetch's hits live in a window of this many layers (0: none)

    def __post_init__(self) -> None:
        Waitable.__init__(self)

    def mark_computed(self, layer: int) -> None:
        self.computed = max(self.computed, layer + 1)
        self.note()


class Registry:
    def __init__(self, make: Callable[[], Waitable], ttl_s: float = 120.0):
        self.make, self.ttl_s = make, ttl_s
        self.items: dict[object, Waitable] = {}

    def get(self, key) -> Waitable:
        """The entry of `key`, made if new (a report may arrive before its holder)."""
        item = self.items.get(key)
        if item is None:
            self._sweep()
            item = self.items[key] = self.make()
        return item

    def hold(self, key) -> Waitable:
        item = self.get(key)
        item.holders += 1
        return item

    def release(self, key) -> None:
        item = self.items.get(key)
        if item is not None:
            item.holders -= 1
            if item.holders <= 0:
                del self.items[key]

    def fail(self, pred: Callable[[object], bool], error: str) -> None:
        for key, item in self.items.items():
            if pred(key):
                item.fail(error)

    def _sweep(self) -> None:
        now = time.monotonic()
        for key in [k for k, v in self.items.items() if v.holders <= 0 and now - v.born > self.ttl_s]:
            del self.items[key]
