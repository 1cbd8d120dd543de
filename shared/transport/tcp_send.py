"""The tcp initiator's bulk sender: a thread that owns the bulk socket's sends.

Owns `BulkSender`. An initiator's bulk socket carries bulk frames only (WRITE payloads,
READ requests, GRANT), so no class scheduling is needed on it: frames go out in FIFO
order, many per `sendmsg` (up to BULK_BATCH bytes), from a thread, so the copy into
the kernel and the waits for buffer room run with the GIL released beside the event
loop, and the loop pays one hand-over per transfer instead of one scheduler turn per
piece. Traffic classes still rank across sockets: before each batch the thread reads
the endpoint gate (gate.py); while latency work is open anywhere on the endpoint it
takes its turn through the loop (`LinkGate.bulk_turn`) for a batch of at most
BULK_CHUNK bytes, so latency pieces overtake bulk between bulk batches.

Example: `write` of 672 pieces of 96 KiB -> one `submit_many` (one wakeup) -> the
thread sends ~5 frames (512 KiB) per sendmsg; a latency pull that opens the gate
meanwhile holds bulk after the batch in flight, until its credit or close admits more.
"""

from __future__ import annotations

import asyncio
import collections
import select
import socket
import threading
from collections.abc import Callable

from .classes import BULK_BATCH, BULK_CHUNK, LinkGate
from .tcp_wire import IOV_MAX

Bufs = list[bytes | memoryview]


class BulkSender:
    """FIFO frames onto one socket from a thread (see module docstring)."""

    def __init__(self, sock: socket.socket, gate: LinkGate, on_error: Callable[[BaseException], None]) -> None:
        self.sock, self.gate, self.on_error = sock, gate, on_error
        self.loop = asyncio.get_running_loop()
        self._q: collections.deque[tuple[Bufs, int]] = collections.deque()
        self._wake = threading.Event()
        self._stop = False
        self._thread = threading.Thread(target=self._run, name="dp-tcp-bulk-tx", daemon=True)
        self._thread.start()

    def submit(self, cls: int, item: Bufs, nbytes: int, *, hold: bool = False) -> None:
        """ClassSender's face (the class is always bulk here; nothing is held)."""
        self._q.append((item, nbytes))
        self._wake.set()

    def submit_many(self, cls: int, frames: list[tuple[Bufs, int]]) -> None:
        self._q.extend(frames)
        self._wake.set()

    def _run(self) -> None:
        try:
            while not self._stop:
                self._wake.wait()
                self._wake.clear()  # before draining: a frame queued after this wakes us again
                while self._q and not self._stop:
                    self._send(self._batch())
        except (OSError, ConnectionError, RuntimeError) as exc:  # RuntimeError: the loop closed
            if not self._stop:
                try:
                    self.loop.call_soon_threadsafe(self.on_error, exc)
                except RuntimeError:
                    pass

    def _batch(self) -> Bufs:
        busy = self.gate.policy.busy  # a racy read is fine: a miss sends one batch early
        limit = BULK_CHUNK if busy else BULK_BATCH
        bufs: Bufs = []
        total = 0
        q = self._q
        while q and (not bufs or total + q[0][1] <= limit) and len(bufs) < IOV_MAX - 4:
            item, n = q.popleft()
            bufs.extend(item)
            total += n
        if busy:
            turn = asyncio.run_coroutine_threadsafe(self.gate.bulk_turn(total), self.loop)
            while not self._stop:
                try:
                    turn.result(0.2)
                    break
                except TimeoutError:
                    continue
        return bufs

    def _send(self, bufs: Bufs) -> None:
        sock, poller = self.sock, None
        while bufs:
            try:
                n = sock.sendmsg(bufs)
            except BlockingIOError:
                if poller is None:
                    poller = select.poll()
                    poller.register(sock.fileno(), select.POLLOUT)
                poller.poll(200)
                if self._stop:
                    return
                continue
            bufs = _advance(bufs, n)

    def close(self) -> None:
        """Stop the thread (frames still queued are dropped; their transfers fail as PeerGone)."""
        self._stop = True
        self._q.clear()
        self._wake.set()
        self._thread.join(5)


def _advance(bufs: Bufs, n: int) -> Bufs:
    """Drop the first `n` bytes from a buffer list."""
    i = 0
    while i < len(bufs) and n >= len(bufs[i]):
        n -= len(bufs[i])
        i += 1
    rest = bufs[i:]
    if n and rest:
        rest[0] = memoryview(rest[0])[n:]
    return rest
