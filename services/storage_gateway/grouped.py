"""One storage read in layer groups: a request's blocks land group of layers by group of layers,
so the prefill engine computes layer l as soon as its group is in the buffer, not after the
whole blocks.

A Full Block is its layers end to end, so layers [lo, hi) of a block are one contiguous range
of its file. Sequence for keys [k0, k1], groups of 2 layers of a 4-layer model:

    reserve the request's bytes on the emulated storage NIC (its place in the FIFO, once)
    open k0, k1: sizes and headers checked    -> report(0 layers, 2 blocks, eta of the last byte)
    at the time layers 0-1 of both have crossed the NIC: read them   -> report(2, 2, eta)
    at the time layers 2-3 have crossed: read them                   -> report(4, 2, 0)
    verify both checksums (fed as the parts landed); close, unpin    -> (2 blocks, no stop)

A block missing at open ends the chain there (fewer blocks reported from the first report on);
a checksum that fails at the end makes the result shorter than what was reported -- the
reader must then treat every layer of the blocks past it as wrong (the traffic-manager fails
the load before its last layer: the engine never finishes a forward on them). The node's
read queue shrinks as each group lands: it counts bytes queued or in flight only.

Owns: ``GroupedRead``. Does not own: files (``store_reads.py``), the rate (``bucket.py``),
threads and I/O slots (``engine.py``).
"""
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
        """Layers [lo, hi) of every open block into its slot, striped over the I/O threads free now."""
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
