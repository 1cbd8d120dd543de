"""Where a traffic-manager keeps track of the layers of a request: read from storage, computed by its
engine, sent on to the decode engine.

Two registries, both fed from bus handlers and awaited by the fetch and push tasks:
- `ReadTracks`: per (request, read tag) how far a storage read in layer groups has got
  (`LayersRead` reports: opened with `blocks` found, `layers` landed) and its final count
  once the gateway's (or the DE traffic-manager's) reply is in;
- `LayerStates`: per request the layers its prefill engine has computed (`LayersComputed`)
  and the layers pushed to the DE buffer; a fetch whose hits live in a window waits here
  before reusing a layer's slots.
Waiting is on one asyncio.Event per entry, set on every change (each waiter re-checks its
own condition). A wait's deadline runs from the entry's last progress, not from the wait's
start: every change (a layer read, computed or pushed, or the engine's keep-alive while a
forward runs: `ForwardAlive`) starts it again, so a slow but moving machine
never fails a healthy request, while a peer that went silent is given up on `timeout`
after its last sign of life. An entry nobody holds any more is dropped; one that was never
held (a report arriving late) is dropped after `ttl_s`. Pure asyncio, no I/O.
"""
from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from dataclasses import dataclass


class Stalled(LookupError):
    """A wait saw no progress within its deadline (a LookupError: callers that catch one catch this)."""


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
        """Wait until `ready()`; raises Stalled(what) (a LookupError) once nothing moved for `timeout`
        (from the wait's start or the last `note`, whichever is later), RuntimeError when failed."""
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
    """One storage read of a fetch: opened (blocks found, eta), layers landed, final verified count."""

    opened: int | None = None  # blocks found (None: not opened yet)
    eta_s: float = 0.0
    layers: int = 0
    final: int | None = None  # blocks verified (None: the reply is not in yet)
    final_error: str = ""

    def __post_init__(self) -> None:
        Waitable.__init__(self)

    def has(self, layer: int, last: bool) -> bool:
        """Layer `layer` is in the buffer (the `last` layer: only once the read is over, checksums checked)."""
        return self.final is not None or (not last and self.layers > layer)

    def finish(self, blocks: int, error: str = "") -> None:
        self.final, self.final_error = blocks, error
        if self.opened is None:
            self.opened = blocks
        self.note()


@dataclass(eq=False)
class LayerState(Waitable):
    """One request's final forward on this TM's engine: layers computed, layers pushed."""

    computed: int = 0  # layers 0..computed-1 have their KV written by the engine
    pushed: int = 0  # layers 0..pushed-1 have landed in the DE buffer
    window: int = 0  # a fetch's hits live in a window of this many layers (0: none)

    def __post_init__(self) -> None:
        Waitable.__init__(self)

    def mark_computed(self, layer: int) -> None:
        """The engine reports layers 0..layer computed (`LayersComputed`): the push may send them."""
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
