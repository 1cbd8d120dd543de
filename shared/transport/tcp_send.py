"""The tcp initiator's bulk sender: a thread that owns the bulk socket's sends."""

from __future__ import annotations

import asyncio
import collections
import select
import socket
import threading
from collections.abc import Callable

from .classes import BULK_BATCH, BULK_CHUNK, LinkGate
from .tcp_wire import IOV_MAX, advance_bufs, head_bufs

Bufs = list[bytes | memoryview]


class BulkSender:
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
        bufs: Bufs = []
        total = 0
        q = self._q
        while q and (not bufs or total + q[0][1] <= BULK_BATCH) and len(bufs) < IOV_MAX // 2:
            item, n = q.popleft()
            bufs.extend(item)
            total += n
        return bufs

    def _turn(self, nbytes: int) -> None:
        turn = asyncio.run_coroutine_threadsafe(self.gate.bulk_turn(nbytes), self.loop)
        while not self._stop:
            try:
                turn.result(0.2)
                return
            except TimeoutError:
                continue

    def _send(self, bufs: Bufs) -> None:
        sock, poller, allowed = self.sock, None, 0
        while bufs and not self._stop:
            if allowed <= 0 and self.gate.policy.busy:
                allowed = min(BULK_CHUNK, sum(len(b) for b in bufs))
                self._turn(allowed)
            try:
                n = sock.sendmsg(head_bufs(bufs, allowed) if allowed > 0 else bufs[:IOV_MAX])
            except BlockingIOError:
                if poller is None:
                    poller = select.poll()
                    poller.register(sock.fileno(), select.POLLOUT)
                poller.poll(200)
                continue
            allowed -= n
            bufs = advance_bufs(bufs, n)

    def close(self) -> None:
        """Stop the thread (frames still queued are dropped; their transfers fail as PeerGone)."""
        self._stop = True
        self._q.clear()
        self._wake.set()
        self._thread.join(5)
