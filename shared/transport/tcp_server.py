"""The tcp backend's accepting side: one authenticated socket's frames served against the regions."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Callable, Sequence

from .aio import TaskOwner
from .base import TrafficClass
from .classes import ClassSender, LinkGate
from .errors import TransportError
from .grants import TOKEN, Bindings, GrantTable
from .tcp_bulk import BulkReader
from .tcp_send import BulkSender
from .tcp_wire import (ACK_ME, HLEN, PUSH_SOCKBUF, FrameSock, Kind, cap_kernel_queue, encode_error, header, segments,
                       table_bytes)

Bufs = list[bytes | memoryview]


class ReadySock(FrameSock):
    """A FrameSock that calls `on_ready()` as bytes arrive, a loop turn before the reader runs, so
    bulk waits from then on; a late readiness is checked with a peek."""

    on_ready: Callable[[], None] | None = None

    def _readable(self) -> None:
        if self._rwait is not None and self.on_ready is not None:
            try:
                self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT)
                self.on_ready()  # bytes (or the end) came
            except BlockingIOError:
                pass  # nothing there: a stale readiness
            except OSError:
                self.on_ready()  # a broken socket: the reader finds out and the conn settles
        super()._readable()


def _flatten(batch: list[Bufs]) -> Bufs:
    return [b for frame in batch for b in frame]


class FrameLink:
    """A FrameSock plus its class-scheduled sender task; shared by both sides."""

    def __init__(self, fs: FrameSock, weights: Sequence[int], on_gone: object, gate: LinkGate,
                 threaded: bool = False) -> None:
        self.fs = fs
        self.tasks = TaskOwner()
        self.sender: ClassSender[Bufs] | BulkSender
        if threaded:  # a socket that carries bulk frames only: FIFO from a thread (tcp_send.py)
            self.sender = BulkSender(fs.sock, gate, on_gone)  # type: ignore[arg-type]
        else:
            self.sender = ClassSender(self._emit, weights, on_error=on_gone, gate=gate,  # type: ignore[arg-type]
                                      send_now=fs.try_send)
            self.tasks.spawn(self.sender.run(), "dp-tcp-send")

    async def _emit(self, batch: list[Bufs]) -> None:
        await self.fs.sendv(_flatten(batch))

    async def close(self) -> None:
        if isinstance(self.sender, BulkSender):
            self.sender.close()
        await self.tasks.aclose()
        self.fs.close()


class ServerConn:
    def __init__(self, sock: socket.socket, grants: GrantTable, weights: Sequence[int], gate: LinkGate) -> None:
        self.bindings = Bindings(grants)  # grant handles (a frame's rid) of this socket only
        self.view, self.bind = self.bindings.view, self.bindings.bind
        self.gate = gate
        self.done = asyncio.Event()
        self._writing: set[int] = set()  # latency write reqs mid-transfer (gate held open)
        self._capped = False  # the kernel queue is capped once the conn is seen to carry bulk
        self._arrived = False  # a latency frame arrived and holds the gate until it is served
        self.fs = ReadySock(sock)
        self.link = FrameLink(self.fs, weights, self._gone, gate)
        self.link.tasks.spawn(self._serve(), "dp-tcp-serve")

    def _gone(self, exc: BaseException) -> None:
        self.done.set()

    async def _serve(self) -> None:
        try:
            first = await self.link.fs.read_header()
            while first[0] == Kind.GRANT:  # bindings come first; the first transfer frame decides
                await self._frame(*first)
                first = await self.link.fs.read_header()
            if first[1] != TrafficClass.LATENCY and first[0] in (Kind.WRITE, Kind.WRITEV):
                # a bulk socket that pushes: its payload receives move to a thread (tcp_bulk.py);
                # one that starts by pulling stays here (its frames are small requests)
                await self._serve_on_thread(first)
                return
            if first[1] == TrafficClass.LATENCY:
                self.fs.on_ready = self._latency_arrived  # a latency socket: bulk yields as its bytes arrive
            await self._frame(*first)
            while True:
                self._served()
                await self._frame(*await self.link.fs.read_header())
        except (OSError, ConnectionError):
            self.done.set()
        finally:
            self._served()
            for _ in self._writing:
                self.gate.close()
            self._writing.clear()
            with contextlib.suppress(OSError):  # EOF, a broken socket or frames that cannot be framed:
                self.link.fs.sock.shutdown(socket.SHUT_RDWR)  # the initiator sees the end at once

    def _latency_arrived(self) -> None:
        if not self._arrived:
            self._arrived = True
            self.gate.open()

    def _served(self) -> None:
        if self._arrived:
            self._arrived = False
            self.gate.close()

    async def _serve_on_thread(self, first: tuple[int, int, int, int, int, int, int, int]) -> None:
        cap_kernel_queue(self.link.fs.sock, receive=PUSH_SOCKBUF)  # pushed bulk comes in; answers go out
        self._capped = True
        reader = BulkReader(self.link.fs, self.view, self.bind, self.gate, self.link.sender.submit)
        reader.start(first)
        try:
            await asyncio.shield(reader.done)
        finally:
            if not reader.done.done():  # closing: wake the thread (its receive sees EOF), let it end
                with contextlib.suppress(OSError):
                    self.link.fs.sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(BaseException):
                    await asyncio.wait_for(asyncio.shield(reader.done), 5)
            self.done.set()

    async def _receive(self, cls: int, flags: int, req: int, dst: memoryview) -> None:
        """Land one WRITE payload; latency writes hold the gate open from first frame to last."""
        if cls != TrafficClass.LATENCY:
            await self.gate.bulk_turn(len(dst))
            await self.link.fs.read_into(dst)
            return
        if req not in self._writing:
            self._writing.add(req)
            self.gate.open()
        try:
            await self.link.fs.read_into(dst)
            self.gate.served(len(dst))
        finally:
            if flags & ACK_ME:
                self._writing.discard(req)
                self.gate.close()

    async def _frame(self, kind: int, cls: int, flags: int, req: int, rid: int, idx: int, off: int, n: int) -> None:
        fs, send = self.link.fs, self.link.sender.submit
        if cls != TrafficClass.LATENCY and not self._capped:
            self._capped = True
            cap_kernel_queue(fs.sock)
        try:
            if kind in (Kind.WRITE, Kind.WRITEV):  # every granted slice checked before a byte lands
                segs = [(off, n)] if kind == Kind.WRITE else segments(await fs.read_bytes(table_bytes(idx)), n)
                dsts = [self.view(rid, o, m, True) for o, m in segs]
                for i, dst in enumerate(dsts):
                    await self._receive(cls, flags if i == len(dsts) - 1 else 0, req, dst)
                if flags & ACK_ME:
                    send(TrafficClass.LATENCY, [header(Kind.ACK, cls, 0, req, rid, idx, 0, 0)], HLEN)
            elif kind == Kind.READ:
                src = self.view(rid, off, n, False)
                send(cls, [header(Kind.DATA, cls, 0, req, rid, idx, off, n), src], HLEN + n,
                     hold=cls == TrafficClass.LATENCY)
            elif kind == Kind.GRANT:
                self.bind(rid, await fs.read_bytes(n) if n == TOKEN else b"")
                if n != TOKEN:
                    await fs.skip(n)
        except TransportError as exc:
            if kind in (Kind.WRITE, Kind.WRITEV):
                await fs.skip(n)
            body = encode_error(exc)
            send(TrafficClass.LATENCY, [header(Kind.ERR, cls, 0, req, rid, idx, 0, len(body)), body], HLEN)

    async def close(self) -> None:
        await self.link.close()
