"""The tcp server's bulk receive half on its own thread."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable

from .base import TrafficClass
from .classes import BULK_CHUNK, LinkGate
from .errors import TransportError
from .grants import TOKEN
from .tcp_wire import ACK_ME, HLEN, FrameSock, Kind, advance_bufs, encode_error, header, segments, table_bytes

Header = tuple[int, int, int, int, int, int, int, int]
Submit = Callable[..., None]  # ClassSender.submit (loop side only)
View = Callable[[int, int, int, bool], memoryview]  # (handle, offset, length, write) -> granted slice
Bind = Callable[[int, bytes], None]  # a GRANT frame: handle -> token


class BulkReader:
    def __init__(self, fs: FrameSock, view: View, bind: Bind, gate: LinkGate, submit: Submit) -> None:
        self.fs, self.view, self.bind, self.gate, self.submit = fs, view, bind, gate, submit
        self.loop = asyncio.get_running_loop()
        self.done: asyncio.Future[BaseException] = self.loop.create_future()
        self._latency: set[int] = set()  # latency write reqs mid-transfer (gate held open)
        self._out: list[tuple[Callable[..., object], tuple[object, ...]]] = []  # thread side only

    def start(self, first: Header) -> None:
        threading.Thread(target=self._run, args=(first,), name="dp-tcp-bulk-rx", daemon=True).start()

    def _run(self, first: Header) -> None:
        reason: BaseException = ConnectionResetError("peer closed")
        try:
            hdr = first
            while True:
                self._frame(*hdr)
                if not self.fs.staged_header:
                    self._flush()  # about to wait on the socket: hand the loop what it must answer
                hdr = self.fs.read_header_sync()
        except (OSError, ConnectionError, RuntimeError) as exc:  # RuntimeError: the loop closed
            reason = exc
        finally:
            self._post(self._finish, reason)
            self._flush()

    def _finish(self, reason: BaseException) -> None:
        for _ in self._latency:
            self.gate.close()
        self._latency.clear()
        if not self.done.done():
            self.done.set_result(reason)

    def _post(self, fn: Callable[..., object], *args: object) -> None:
        self._out.append((fn, args))

    def _flush(self) -> None:
        if not self._out:
            return
        calls, self._out = self._out, []
        try:
            self.loop.call_soon_threadsafe(_run_all, calls)
        except RuntimeError:  # loop closed: nobody is left to answer
            pass

    def _frame(self, kind: int, cls: int, flags: int, req: int, rid: int, idx: int, off: int, n: int) -> None:
        try:
            if kind == Kind.WRITE or kind == Kind.WRITEV:
                self._write(cls, flags, req, self._dests(kind, rid, idx, off, n))
                if flags & ACK_ME:
                    self._post(self.submit, TrafficClass.LATENCY, [header(Kind.ACK, cls, 0, req, rid, idx, 0, 0)], HLEN)
            elif kind == Kind.READ:
                src = self.view(rid, off, n, False)
                self._post(self._answer_read, cls, [header(Kind.DATA, cls, 0, req, rid, idx, off, n), src], HLEN + n)
            elif kind == Kind.GRANT:
                token = bytearray(n)
                self.fs.read_into_sync(memoryview(token))
                self.bind(rid, bytes(token) if n == TOKEN else b"")
        except TransportError as exc:
            if kind == Kind.WRITE or kind == Kind.WRITEV:
                self.fs.skip_sync(n)
            body = encode_error(exc)
            self._post(self.submit, TrafficClass.LATENCY, [header(Kind.ERR, cls, 0, req, rid, idx, 0, len(body)), body], HLEN)

    def _answer_read(self, cls: int, frame: list[bytes | memoryview], nbytes: int) -> None:
        self.submit(cls, frame, nbytes, hold=cls == TrafficClass.LATENCY)

    def _dests(self, kind: int, rid: int, idx: int, off: int, n: int) -> list[memoryview]:
        """The granted slices a WRITE / WRITEV payload lands in (every one checked before a byte moves)."""
        if kind == Kind.WRITE:
            return [self.view(rid, off, n, True)]
        table = bytearray(table_bytes(idx))
        self.fs.read_into_sync(memoryview(table))
        return [self.view(rid, o, m, True) for o, m in segments(bytes(table), n)]

    def _write(self, cls: int, flags: int, req: int, dsts: list[memoryview]) -> None:
        if cls != TrafficClass.LATENCY:
            bufs = [d for d in dsts if len(d)]
            while bufs:  # one vectored receive per call; a bounded one per gate turn while latency is open
                limit = 1 << 62
                if self.gate.policy.busy:  # a racy read is fine: a miss admits one receive early
                    self._flush()
                    limit = min(BULK_CHUNK, sum(len(b) for b in bufs))
                    asyncio.run_coroutine_threadsafe(self.gate.bulk_turn(limit), self.loop).result()
                bufs = advance_bufs(bufs, self.fs.fill_sync(bufs, limit))  # type: ignore[assignment, arg-type]
            return
        if req not in self._latency:
            self._latency.add(req)
            self._post(self.gate.open)
        for dst in dsts:
            self.fs.read_into_sync(dst)
            self._post(self.gate.served, len(dst))
        if flags & ACK_ME:
            self._latency.discard(req)
            self._post(self.gate.close)


def _run_all(calls: list[tuple[Callable[..., object], tuple[object, ...]]]) -> None:
    for fn, args in calls:
        fn(*args)
