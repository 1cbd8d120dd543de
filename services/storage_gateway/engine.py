"""The gateway's I/O engine: rate-limited, threaded block reads and writes over a store.

asyncio API, no NATS. A read stops at the first missing or corrupt block; a cancelled read waits
for its stripes, so ``dest`` is quiet when the cancellation surfaces. Writes run in the
background on their own pool: reads never queue behind them."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Awaitable, Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

import msgspec

from services.storage_gateway.block_file import bytes_view, check_slots
from services.storage_gateway.bucket import TokenBucket
from services.storage_gateway.chain import Chain, read_cached, read_chain
from services.storage_gateway.grouped import GroupedRead
from services.storage_gateway.io_threads import IoThreads
from services.storage_gateway.read_queue import ReadQueue, ReadQueueSnapshot
from services.storage_gateway.store import DirectoryStore, WriteOutcome

T = TypeVar("T")

STRIPE_MIN_BYTES = 4 * 2**20  # a second thread pays off only past a few MiB of copying


class ReadResult(msgspec.Struct, frozen=True, kw_only=True):
    blocks: int  # leading blocks read and verified into dest
    bytes: int  # their payload bytes
    requested: int
    stop_key: bytes | None = None  # the first block that could not be served
    stop_reason: str | None = None  # why ("missing", a format error, an OSError)


class GatewayCore:
    def __init__(
        self,
        store: DirectoryStore,
        read_bucket: TokenBucket | None = None,
        write_bucket: TokenBucket | None = None,
        io_threads: int = 4,
        *,
        write_threads: int = 1,
        max_write_defer_s: float = 0.0,
        stripe_min_bytes: int = STRIPE_MIN_BYTES,
        inline_bytes: int = 0,
    ) -> None:
        self.store = store
        self._read_bucket = read_bucket or TokenBucket(None)
        self._write_bucket = write_bucket or TokenBucket(None)
        self._reads = IoThreads(io_threads, "sg-read")
        self._write_pool = ThreadPoolExecutor(write_threads, thread_name_prefix="sg-write")
        self._io_threads = io_threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(io_threads)
        self._reads_idle = asyncio.Event()
        self._max_write_defer_s = max_write_defer_s
        self._stripe_min_bytes = max(1, stripe_min_bytes)
        self._inline_bytes = inline_bytes  # warm requests up to this are read on the loop (chain.py)
        self._running = 0  # stripes on the read threads now
        self._queue = ReadQueue()

    def _bind_loop(self) -> None:
        """asyncio primitives belong to one loop; a core reused from a new loop gets fresh ones."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        self._loop = loop
        self._slots = asyncio.Semaphore(self._io_threads)
        self._reads_idle = asyncio.Event()
        self._note_idle()

    # ----- reads ------------------------------------------------------------
    async def read_blocks(
        self, keys: Sequence[bytes], dest: memoryview, offsets: Sequence[int], group_layers: int = 0,
        report: Callable[[int, int, float], Awaitable[None]] | None = None,
    ) -> ReadResult:
        """Full Block payloads of ``keys`` into ``dest`` at ``offsets`` (layer groups:
        ``group_layers``)."""
        self._bind_loop()
        view = bytes_view(dest)
        size = self.store.layout.payload_bytes
        check_slots(len(view), size, keys, offsets)
        if report is not None and 0 < group_layers < self.store.layout.n_layers:
            self._reads_idle.clear()
            slots = [view[off : off + size] for off in offsets]
            good, key, why = await GroupedRead(self, keys, slots, group_layers, report).run()
            return ReadResult(blocks=good, bytes=good * size, requested=len(keys), stop_key=key, stop_reason=why)
        n = len(keys)
        chain = Chain(stop=n)
        self._queue.enqueue(n, n * size)
        self._reads_idle.clear()
        try:
            await self._take_read_bytes(n * size)
            slots = [view[off : off + size] for off in offsets]
            start = read_cached(self.store, keys, slots, chain) if self._inline_ok(n, size) else 0
            if chain.wants(start):
                await self._read_striped(keys, slots, chain, start)
        finally:
            self._queue.dequeue(n, n * size)
            self._queue.finish_request()
            self._note_idle()
        return ReadResult(
            blocks=chain.stop,
            bytes=chain.stop * size,
            requested=n,
            stop_key=chain.key,
            stop_reason=chain.reason,
        )

    async def _take_read_bytes(self, nbytes: int) -> None:
        """The request's bytes from the read bucket with one wait: the SNIC is paced per request, FIFO."""
        delay = self._read_bucket.reserve(nbytes)
        if delay <= 0:
            return
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self._read_bucket.refund(nbytes)
            raise

    def _inline_ok(self, count: int, size: int) -> bool:
        """The loop reads a request itself: one stripe, at most ``inline_bytes``, no stripe running."""
        return (count * size <= self._inline_bytes and not self._running and not self._slots.locked()
                and self.stripes_for(count, size) == 1)

    async def _read_striped(
        self, keys: Sequence[bytes], slots: Sequence[memoryview], chain: Chain, start: int = 0
    ) -> None:
        """Stripe ``s`` of ``k`` takes blocks ``start+s, start+s+k, ...``: every stripe near the front."""
        want = self.stripes_for(len(keys) - start, self.store.layout.payload_bytes)
        await self.striped(want, lambda s, k: self._read_chain(keys, slots, chain, start + s, k),
                           on_cancel=lambda: setattr(chain, "cancelled", True))

    async def _take_slots(self, want: int) -> int:
        """One I/O slot (FIFO), then up to ``want - 1`` more only if free now."""
        await self._slots.acquire()
        taken = 1
        while taken < want and not self._slots.locked():
            await self._slots.acquire()  # free: returns without suspending
            taken += 1
        return taken

    def _read_chain(
        self, keys: Sequence[bytes], slots: Sequence[memoryview], chain: Chain,
        first: int = 0, step: int = 1,
    ) -> None:
        read_chain(self.store, keys, slots, chain, first, step)

    def _note_idle(self) -> None:
        if self._queue.idle:
            self._reads_idle.set()

    # ----- what a read in layer groups uses (grouped.py) -----------------------------
    queue = property(lambda self: self._queue)  # ReadQueue
    read_bucket = property(lambda self: self._read_bucket)  # TokenBucket

    def note_idle(self) -> None:
        self._note_idle()

    async def in_io(self, fn: Callable[..., T], *args: object) -> T:
        """``fn`` on a read thread (waited for even if cancelled)."""
        return await self._reads.call(fn, *args)

    def stripes_for(self, count: int, nbytes_each: int) -> int:
        return max(1, min(count, self._io_threads, -(-count * nbytes_each // self._stripe_min_bytes)))

    async def striped(self, want: int, stripe: Callable[[int, int], None],
                      on_cancel: Callable[[], None] = lambda: None) -> None:
        """``stripe(s, k)`` for s < k on free I/O slots. Cancelled: ``on_cancel()``, then every stripe is
        waited for. A stripe's error is re-raised after all finished."""
        taken = await self._take_slots(want)
        self._running += taken
        try:
            calls = [functools.partial(stripe, s, taken) for s in range(taken)]
            fut = self._reads.run_batch(asyncio.get_running_loop(), calls)
            try:
                errors = await asyncio.shield(fut)
            except asyncio.CancelledError:
                on_cancel()
                await asyncio.wait([fut])
                raise
        finally:
            self._running -= taken
            for _ in range(taken):
                self._slots.release()
        for error in errors:
            if error is not None:
                raise error

    # ----- writes -----------------------------------------------------------
    async def write_block(self, key: bytes, payload: memoryview) -> WriteOutcome:
        """Persist one Full Block payload in the background; ``payload`` must stay unchanged until then."""
        self._bind_loop()
        await self._yield_to_reads()
        if not await _in_thread(self._write_pool, self.store.contains, key):
            await self._write_bucket.acquire(self.store.block_file_bytes)
        return await _in_thread(self._write_pool, self.store.write, key, payload)

    async def _yield_to_reads(self) -> None:
        if self._max_write_defer_s <= 0 or self._reads_idle.is_set():
            return
        try:
            await asyncio.wait_for(self._reads_idle.wait(), self._max_write_defer_s)
        except TimeoutError:  # never starve persistence entirely
            pass

    # ----- lookups and reporting --------------------------------------------
    def hit_length(self, keys: Sequence[bytes]) -> int:
        """Leading ``keys`` present in the store (stat only; blocking)."""
        return self.store.longest_prefix(keys)

    async def hit_length_async(self, keys: Sequence[bytes]) -> int:
        return await self._reads.call(self.store.longest_prefix, keys)

    def queue_snapshot(self) -> ReadQueueSnapshot:
        return self._queue.snapshot()

    def check_integrity(self) -> None:
        self._queue.check_integrity()
        self.store.check_integrity()

    def close(self) -> None:
        self._reads.close()
        self._write_pool.shutdown(wait=True)


async def _in_thread(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: object) -> T:
    """Run ``fn`` on ``pool``; if cancelled, wait for the thread before re-raising."""
    fut = asyncio.get_running_loop().run_in_executor(pool, fn, *args)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        raise
