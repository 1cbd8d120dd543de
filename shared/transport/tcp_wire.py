"""The tcp backend's wire: a 32-byte frame header and a non-blocking framed socket.

Header: kind u8 | cls u8 | flags u16 | req u32 | rid u32 | idx u32 | offset u64 | length u64.
A frame names a grant handle (rid) bound by a GRANT frame, never a region.
"""

from __future__ import annotations

import asyncio
import enum
import select
import socket
import struct

import msgspec

from .errors import NotGranted, OutOfBounds, RegionNotFound, RemoteError, TransportError

HEADER = struct.Struct("<BBHIIIQQ")
HLEN = HEADER.size  # 32
IOV_MAX = 512  # buffers per sendmsg (Linux allows 1024)
STAGING = 256 << 10  # scratch for skipped payloads
# A reader stages at most this much per header read: headers of a burst of small frames
# (READ requests) come in one receive, and at most this many payload bytes are copied
# twice (through staging) per frame.
HEADER_FILL = 4 << 10
# Kernel buffers of a bulk socket: bytes queued there are bytes the CPUs and the link
# must move before a latency frame that arrives later. 512 KiB keeps loopback bulk
# throughput (bench: bulk alone) while bounding that backlog; it caps the direction of
# pulled bulk (DATA answers, sent from an event loop that also serves latency work).
BULK_SOCKBUF = 512 << 10
# Pushed bulk (WRITEV frames, moved by threads that take a gate turn every BULK_CHUNK while
# latency is open): 4 MiB cut syscalls per 63 MiB ~420 -> ~160, GIL hand-offs ~240 -> ~60.
PUSH_SOCKBUF = 4 << 20
# A loop-side reader yields after this many bytes taken without waiting (a staged header
# counts HEADER_COST): a full socket must not hold the loop while a latency frame waits.
YIELD_EVERY = 256 << 10
HEADER_COST = 4 << 10
SEG = struct.Struct("<QQ")  # one WRITEV table entry: offset, length
MAX_SEGS = 64  # segments per WRITEV frame
BULK_FRAME = 1 << 20  # payload bytes per WRITEV frame (a longer piece is cut)


class Kind(enum.IntEnum):
    WRITE = 1
    READ = 2
    DATA = 3
    ACK = 4
    ERR = 5
    GRANT = 6
    WRITEV = 7


ACK_ME = 1


class WireError(msgspec.Struct, array_like=True):
    """Why the server refused a frame; decoded back into the typed exception."""

    code: int  # 1 region not found, 2 out of bounds, 3 other, 4 not granted (detail: why)
    name: str = ""
    offset: int = 0
    length: int = 0
    size: int = 0
    detail: str = ""


def encode_error(exc: TransportError) -> bytes:
    if isinstance(exc, RegionNotFound):
        return msgspec.msgpack.encode(WireError(1, exc.name))
    if isinstance(exc, OutOfBounds):
        return msgspec.msgpack.encode(WireError(2, exc.region, exc.offset, exc.length, exc.size))
    if isinstance(exc, NotGranted):
        return msgspec.msgpack.encode(WireError(4, exc.region, exc.offset, exc.length, detail=exc.why))
    return msgspec.msgpack.encode(WireError(3, detail=str(exc)))


_ERR_DECODER = msgspec.msgpack.Decoder(WireError)


def decode_error(payload: bytes, peer: str = "") -> TransportError:
    e = _ERR_DECODER.decode(payload)
    if e.code == 1:
        return RegionNotFound(e.name, where="remote")
    if e.code == 2:
        return OutOfBounds(e.name, e.offset, e.length, e.size)
    if e.code == 4:
        return NotGranted(e.name, e.offset, e.length, f"refused by {peer}: {e.detail}")
    return RemoteError(peer, e.code, e.detail)


def header(kind: Kind, cls: int, flags: int, req: int, rid: int, idx: int, offset: int, length: int) -> bytes:
    return HEADER.pack(kind, cls, flags, req, rid, idx, offset, length)


class FrameSock:
    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self._loop = asyncio.get_running_loop()
        self._stage = bytearray(HEADER_FILL)  # headers (and what came with them) only
        self._sview = memoryview(self._stage)
        self._start = 0
        self._end = 0
        self._fd = sock.fileno()
        self._rwait: asyncio.Future[None] | None = None  # the coroutine waiting for bytes
        self._watching = False  # the fd is registered with the loop for reading
        self._budget = YIELD_EVERY  # bytes this socket may take before it lets the loop run others

    async def _recv_into(self, buf: memoryview) -> int:
        """One receive into `buf` (> 0 bytes); the fd stays registered with the loop while frames keep
        coming, not once per receive as `loop.sock_recv_into` does."""
        if self._budget <= 0:  # a socket that always has bytes must not starve the other links
            self._budget = YIELD_EVERY
            await asyncio.sleep(0)
        while True:
            try:
                got = self.sock.recv_into(buf)
            except BlockingIOError:
                self._budget = YIELD_EVERY
                if not self._watching:
                    self._loop.add_reader(self._fd, self._readable)
                    self._watching = True
                self._rwait = fut = self._loop.create_future()
                try:
                    await fut
                finally:
                    self._rwait = None
                continue
            if not got:
                raise ConnectionResetError("peer closed")
            self._budget -= got
            return got

    def _readable(self) -> None:
        fut = self._rwait
        if fut is None:  # nobody reads now (a reader thread took over, or a gate wait)
            self._unwatch()
        elif not fut.done():
            fut.set_result(None)

    def _unwatch(self) -> None:
        if self._watching:
            self._watching = False
            self._loop.remove_reader(self._fd)

    async def sendv(self, bufs: list[bytes | memoryview]) -> None:
        while bufs:
            try:
                n = self.sock.sendmsg(bufs[:IOV_MAX])
            except BlockingIOError:
                n = 0
            bufs = advance_bufs(bufs, n)
            if bufs:
                await self._writable()

    def try_send(self, bufs: list[bytes | memoryview]) -> list[bytes | memoryview] | None:
        """One sendmsg of `bufs` now; what the socket did not take (None: everything went)."""
        try:
            n = self.sock.sendmsg(bufs[:IOV_MAX])
        except BlockingIOError:
            n = 0
        rest = advance_bufs(bufs, n)
        return rest or None

    async def _writable(self) -> None:
        fut = self._loop.create_future()
        fd = self.sock.fileno()
        self._loop.add_writer(fd, _set_once, fut)
        try:
            await fut
        finally:
            self._loop.remove_writer(fd)

    async def read_header(self) -> tuple[int, int, int, int, int, int, int, int]:
        """Next header; raises ConnectionResetError at EOF."""
        while self._end - self._start < HLEN:
            await self._fill()
        h = HEADER.unpack_from(self._stage, self._start)
        self._start += HLEN
        self._budget -= HEADER_COST
        if self._budget <= 0:  # a burst of staged frames (READ requests) yields too
            self._budget = YIELD_EVERY
            await asyncio.sleep(0)
        return h

    async def read_into(self, dst: memoryview) -> None:
        """Fill `dst` exactly: staged bytes first, the rest straight from the socket."""
        n = min(len(dst), self._end - self._start)
        if n:
            dst[:n] = self._sview[self._start : self._start + n]
            self._start += n
        while n < len(dst):
            n += await self._recv_into(dst[n:])

    async def read_bytes(self, length: int) -> bytes:
        out = bytearray(length)
        await self.read_into(memoryview(out))
        return bytes(out)

    async def skip(self, length: int) -> None:
        scratch = memoryview(bytearray(min(length, STAGING) or 1))
        while length:
            n = min(length, len(scratch))
            await self.read_into(scratch[:n])
            length -= n

    async def _fill(self) -> None:
        if self._start:
            rest = self._end - self._start
            self._stage[:rest] = bytes(self._sview[self._start : self._end])  # < HLEN bytes
            self._start, self._end = 0, rest
        # at most HEADER_FILL: the payload that follows goes straight to its slice, not through staging
        self._end += await self._recv_into(self._sview[self._end : HEADER_FILL])

    # Thread side: a reader thread that owns the receive half uses these instead of the
    # awaitables above. The socket stays non-blocking (the loop still sends on it); a
    # would-block receive waits in poll(), GIL released, so the copy out of the kernel
    # runs beside the event loop.

    def read_header_sync(self) -> tuple[int, int, int, int, int, int, int, int]:
        """Next header, reading only what the header lacks (payloads never pass through staging)."""
        have = self._end - self._start
        if have < HLEN:
            if self._start:
                self._stage[:have] = bytes(self._sview[self._start : self._end])
                self._start, self._end = 0, have
            self._end += self._recv_some_sync(self._sview[self._end : HEADER_FILL], HLEN - have)
        h = HEADER.unpack_from(self._stage, self._start)
        self._start += HLEN
        return h

    def read_into_sync(self, dst: memoryview) -> None:
        n = min(len(dst), self._end - self._start)
        if n:
            dst[:n] = self._sview[self._start : self._start + n]
            self._start += n
        if n < len(dst):
            self._recv_some_sync(dst[n:], len(dst) - n)

    def skip_sync(self, length: int) -> None:
        scratch = memoryview(bytearray(min(length, STAGING) or 1))
        while length:
            n = min(length, len(scratch))
            self.read_into_sync(scratch[:n])
            length -= n

    def fill_sync(self, bufs: list[memoryview], limit: int) -> int:
        """Fill the head of `bufs` with at most `limit` bytes (staged ones, else one vectored receive of
        what the kernel holds); returns how many."""
        have = self._end - self._start
        if have:
            n = min(have, len(bufs[0]), limit)
            bufs[0][:n] = self._sview[self._start : self._start + n]
            self._start += n
            return n
        out, poller = head_bufs(bufs, limit), None  # type: ignore[arg-type]
        while True:
            try:
                n = self.sock.recvmsg_into(out)[0]
            except BlockingIOError:
                poller = self._wait_readable(poller)
                continue
            if not n:
                raise ConnectionResetError("peer closed")
            return n

    @property
    def staged_header(self) -> bool:
        return self._end - self._start >= HLEN

    def _recv_some_sync(self, dst: memoryview, at_least: int) -> int:
        got, poller = 0, None
        while got < at_least:
            try:
                n = self.sock.recv_into(dst[got:])
            except BlockingIOError:
                poller = self._wait_readable(poller)
                continue
            if not n:
                raise ConnectionResetError("peer closed")
            got += n
        return got

    def _wait_readable(self, poller):
        if poller is None:
            (poller := select.poll()).register(self.sock.fileno(), select.POLLIN)
        poller.poll()
        return poller

    def close(self) -> None:
        if self._watching and not self._loop.is_closed():
            self._unwatch()
        self.sock.close()


def cap_kernel_queue(sock: socket.socket, send: int = BULK_SOCKBUF, receive: int = BULK_SOCKBUF) -> None:
    """Cap SO_SNDBUF / SO_RCVBUF of a bulk socket (the kernel doubles the value it is given)."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, send // 2)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, receive // 2)


def vector_frames(cls: int, req: int, handle: int, pieces: list[tuple[int, memoryview]],
                  frame_bytes: int = BULK_FRAME) -> list[tuple[list[bytes | memoryview], int]]:
    """WRITEV frames (bufs, wire bytes) of `pieces` ((offset, bytes), each <= frame_bytes), in order,
    at most MAX_SEGS segments and `frame_bytes` payload bytes each; ACK_ME on the last."""
    out: list[tuple[list[bytes | memoryview], int]] = []
    i, n = 0, len(pieces)
    while i < n:
        j, total = i, 0
        while j < n and j - i < MAX_SEGS and (j == i or total + len(pieces[j][1]) <= frame_bytes):
            total += len(pieces[j][1])
            j += 1
        group = pieces[i:j]
        table = struct.pack(f"<{2 * len(group)}Q", *[x for off, b in group for x in (off, len(b))])
        head = header(Kind.WRITEV, cls, ACK_ME if j == n else 0, req, handle, len(group), 0, total) + table
        out.append(([head, *[b for _, b in group]], len(head) + total))
        i = j
    return out


def segments(table: bytes, total: int) -> list[tuple[int, int]]:
    """A WRITEV table as (offset, length) pairs; ConnectionError if it contradicts the header."""
    flat = struct.unpack(f"<{len(table) // 8}Q", table)
    segs = list(zip(flat[::2], flat[1::2], strict=True))
    if sum(n for _, n in segs) != total:
        raise ConnectionAbortedError(f"WRITEV segments sum to {sum(n for _, n in segs)}, header says {total}")
    return segs


def table_bytes(k: int) -> int:
    if not 0 < k <= MAX_SEGS:
        raise ConnectionAbortedError(f"WRITEV with {k} segments (1..{MAX_SEGS} allowed)")
    return k * SEG.size


def head_bufs(bufs: list[bytes | memoryview], limit: int) -> list[bytes | memoryview]:
    out: list[bytes | memoryview] = []
    for b in bufs:
        if limit <= 0 or len(out) >= IOV_MAX:
            break
        if len(b) > limit:
            b = memoryview(b)[:limit]
        out.append(b)
        limit -= len(b)
    return out


def _set_once(fut: asyncio.Future[None]) -> None:
    if not fut.done():
        fut.set_result(None)


def advance_bufs(bufs: list[bytes | memoryview], n: int) -> list[bytes | memoryview]:
    i = 0
    while i < len(bufs) and n >= len(bufs[i]):
        n -= len(bufs[i])
        i += 1
    rest = bufs[i:]
    if n and rest:
        rest[0] = memoryview(rest[0])[n:]
    return rest
