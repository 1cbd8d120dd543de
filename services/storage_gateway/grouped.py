"""One storage read in layer groups: a request's blocks land a group of layers at a time.

The checksums are verified only after the last group: a failure shortens the result after the
fact, and the reader must treat the blocks past it as wrong."""
from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Sequence

from services.storage_gateway.block_file import OpenBlock

Report = Callable[[int, int, float], Awaitable[None]]  # (layers landed, blocks, seconds to the last byte)


class GroupedRead:
    def __init__(self, core, keys: Sequence[bytes], slots: Sequence[memoryview], group_layers: int, report: Report):
        self.core, self.keys, self.slots, self.group, self.report = core, keys, slots, group_layers, report
        self.store = core.store
        self.layer_bytes = self.store.layout.layer_bytes
        self.n_layers = self.store.layout.n_layers

    async def run(self) -> tuple[int, bytes | None, str | None]:
        """(leading blocks read and verified, the first block that was not, why)."""
        core, store, n = self.core, self.store, len(self.keys)
        size = store.layout.payload_bytes
        left = n * size  # bytes still pending on the node's read queue
        core.queue.enqueue(n, left)
        opened: list[OpenBlock] = []
        stop_key = reason = None
        good = 0
        try:
            t_end = time.monotonic() + core.read_bucket.reserve(n * size)
            opened, stop_key, reason = await core.in_io(store.open_blocks, self.keys)
            await self.report(0, len(opened), max(0.0, t_end - time.monotonic()))
            for lo in range(0, self.n_layers, self.group):
                hi = min(self.n_layers, lo + self.group)
                await self._until_crossed(t_end, n * size * (self.n_layers - hi) // self.n_layers)
                await self._read_group(opened, lo, hi)
                part = n * self.layer_bytes * (hi - lo)
                core.queue.dequeue(0, part)
                left -= part
                await self.report(hi, len(opened), max(0.0, t_end - time.monotonic()))
            good, why = await core.in_io(store.end_blocks, opened, len(opened))
            opened = []
            if why is not None:
                stop_key, reason = self.keys[good], why
        finally:
            if opened:  # ended early (cancelled, a bug): nothing counts
                await core.in_io(store.end_blocks, opened, 0)
            core.queue.dequeue(n, left)
            core.queue.finish_request()
            core.note_idle()
        return good, stop_key, reason

    async def _until_crossed(self, t_end: float, bytes_after: int) -> None:
        """Wait until the NIC has passed every byte of this request but the last `bytes_after`."""
        rate = self.core.read_bucket.rate
        if not rate:
            return
        wait = t_end - bytes_after / rate - time.monotonic()
        if wait > 0:
            await asyncio.sleep(wait)

    async def _read_group(self, opened: list[OpenBlock], lo: int, hi: int) -> None:
        """Layers [lo, hi) of every open block into its slot, striped over the free I/O threads."""
        if not opened:
            return
        a, b = lo * self.layer_bytes, hi * self.layer_bytes
        parts = [(ob, self.slots[i][a:b]) for i, ob in enumerate(opened)]
        reader = self.store.reader
        want = self.core.stripes_for(len(parts), b - a)

        def stripe(s: int, k: int) -> None:
            for ob, dest in parts[s::k]:
                reader.read_part(ob, dest)

        await self.core.striped(want, stripe)
