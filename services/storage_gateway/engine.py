"""The gateway's I/O engine: rate-limited, threaded block reads and writes over a
store, with the node's read queue. asyncio API, no NATS (``app.py`` wires it).

One ``read_blocks`` call, keys ``[k0, k1, k2]`` at ``offsets`` in ``dest``:
enqueue 3 blocks on the read queue; reserve their bytes from the read bucket (the
emulated SNIC) on arrival, so requests are paced FIFO, and wait once; then one I/O
slot runs ``store.read_into`` for k0, k1, k2 in turn on the read pool, straight into
``dest[off:off+payload]``. If ``k1`` is missing or corrupt the chain stops there:
``k2`` is not read and the result says 1 block. The blocks are dequeued when the
request finishes, whatever the outcome. One wait and one thread hop per request (not
per block) keeps the gateway's CPU per request low. Cancelling the call waits for
reads already on a thread so ``dest`` is quiet when the cancellation surfaces.

Writes (decode persisting filled blocks) are background: each takes write-bucket
bytes (the SNIC is full duplex: reads and writes have their own buckets) and runs
on its own small pool, so reads never queue behind writes. With
``max_write_defer_s`` > 0 (a shared disk) a write first waits, at most that long,
until the read queue is empty.

Owns: ``GatewayCore``, ``ReadResult``.
Does not own: files (``store.py``), rate (``bucket.py``), counts (``read_queue.py``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

import msgspec

from services.storage_gateway.bucket import TokenBucket
from services.storage_gateway.errors import BlockUnavailable
from services.storage_gateway.read_queue import ReadQueue, ReadQueueSnapshot
from services.storage_gateway.store import DirectoryStore, WriteOutcome

T = TypeVar("T")


class ReadResult(msgspec.Struct, frozen=True, kw_only=True):
    blocks: int  # leading blocks read and verified into dest
    bytes: int  # their payload bytes
    requested: int
    stop_key: bytes | None = None  # the first block that could not be served
    stop_reason: str | None = None  # why ("missing", a format error, an OSError)


@dataclass(slots=True)
class _Chain:
    """Where a read chain stopped: blocks at or after ``stop`` are a miss."""

    stop: int
    key: bytes | None = None
    reason: str | None = None

    def fail(self, i: int, key: bytes, reason: str) -> None:
        if i < self.stop:
            self.stop, self.key, self.reason = i, key, reason


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
    ) -> None:
        self.store = store
        self._read_bucket = read_bucket or TokenBucket(None)
        self._write_bucket = write_bucket or TokenBucket(None)
        self._read_pool = ThreadPoolExecutor(io_threads, thread_name_prefix="sg-read")
        self._write_pool = ThreadPoolExecutor(write_threads, thread_name_prefix="sg-write")
        self._io_threads = io_threads
        self._loop: asyncio.AbstractEventLoop | None = None
        self._slots = asyncio.Semaphore(io_threads)
        self._reads_idle = asyncio.Event()
        self._max_write_defer_s = max_write_defer_s
        self._queue = ReadQueue()

    def _bind_loop(self) -> None:
        """asyncio primitives belong to one loop; a core reused from a new loop
        (tests, benches calling ``asyncio.run`` repeatedly) gets fresh ones."""
        loop = asyncio.get_running_loop()
        if loop is self._loop:
            return
        self._loop = loop
        self._slots = asyncio.Semaphore(self._io_threads)
        self._reads_idle = asyncio.Event()
        self._note_idle()

    # ----- reads ------------------------------------------------------------
    async def read_blocks(
        self, keys: Sequence[bytes], dest: memoryview, offsets: Sequence[int]
    ) -> ReadResult:
        """Read Full Block payloads of ``keys`` into ``dest`` at ``offsets``."""
        self._bind_loop()
        view = _byte_view(dest)
        size = self.store.layout.payload_bytes
        _check_slots(len(view), size, keys, offsets)
        n = len(keys)
        chain = _Chain(stop=n)
        self._queue.enqueue(n, n * size)
        self._reads_idle.clear()
        try:
            await self._take_read_bytes(n * size)
            async with self._slots:
                await _in_thread(self._read_pool, self._read_chain, keys,
                                 [view[off : off + size] for off in offsets], chain)
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
        """The request's bytes from the read bucket, reserved on arrival (so FIFO across
        requests) with one wait: the emulated SNIC is paced per request, not per block."""
        delay = self._read_bucket.reserve(nbytes)
        if delay <= 0:
            return
        try:
            await asyncio.sleep(delay)
        except asyncio.CancelledError:
            self._read_bucket.refund(nbytes)
            raise

    def _read_chain(self, keys: Sequence[bytes], slots: Sequence[memoryview], chain: _Chain) -> None:
        """I/O thread: read blocks in order into their slots; stop at the first that fails."""
        for i, (key, slot) in enumerate(zip(keys, slots, strict=True)):
            try:
                self.store.read_into(key, slot)
            except BlockUnavailable as exc:
                chain.fail(i, key, exc.reason)
                return
            except OSError as exc:  # EIO, ESTALE, EACCES...: a miss, not a crash
                chain.fail(i, key, f"{type(exc).__name__}: {exc}")
                return

    def _note_idle(self) -> None:
        if self._queue.idle:
            self._reads_idle.set()

    # ----- writes -----------------------------------------------------------
    async def write_block(self, key: bytes, payload: memoryview) -> WriteOutcome:
        """Persist one Full Block payload in the background (reads go first).

        ``payload`` must stay unchanged until this returns.
        """
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
        """``hit_length`` off the event loop (for slow shared mounts)."""
        return await _in_thread(self._read_pool, self.store.longest_prefix, keys)

    def queue_snapshot(self) -> ReadQueueSnapshot:
        return self._queue.snapshot()

    def check_integrity(self) -> None:
        self._queue.check_integrity()
        self.store.check_integrity()

    def close(self) -> None:
        """Stop the pools after their running work (call once, off the hot path)."""
        self._read_pool.shutdown(wait=True)
        self._write_pool.shutdown(wait=True)


async def _in_thread(pool: ThreadPoolExecutor, fn: Callable[..., T], *args: object) -> T:
    """Run ``fn`` on ``pool``; if cancelled, wait for the thread before re-raising
    (it may be writing into a caller's buffer)."""
    fut = asyncio.get_running_loop().run_in_executor(pool, fn, *args)
    try:
        return await asyncio.shield(fut)
    except asyncio.CancelledError:
        await asyncio.wait([fut])
        raise


def _byte_view(buf: memoryview) -> memoryview:
    view = memoryview(buf)
    return view if view.format == "B" and view.ndim == 1 else view.cast("B")


def _check_slots(
    dest_len: int, size: int, keys: Sequence[bytes], offsets: Sequence[int]
) -> None:
    if len(keys) != len(offsets):
        raise ValueError(f"{len(keys)} keys but {len(offsets)} offsets")
    for off in offsets:
        if off < 0 or off + size > dest_len:
            raise ValueError(f"slot [{off}, {off + size}) outside dest of {dest_len} bytes")
