"""The tcp backend: one asyncio server per endpoint; per peer, one socket per traffic class."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import socket
from collections.abc import Sequence

from .aio import TaskOwner, deadline
from .base import Endpoint, EndpointDesc, Op, Peer, TrafficClass, coalesce
from .classes import DEFAULT_WEIGHTS, LinkGate, chunk_for, split
from .errors import AuthFailed, PeerGone
from .grants import TOKEN, Grant, Handles, check_grant
from .local import LocalSide
from .regions import RegionTable
from .shm import ShmPeer, shm_reachable
from .tcp_auth import HANDSHAKE_S, accept, initiate, key_of
from .tcp_server import FrameLink, ServerConn
from .tcp_wire import (ACK_ME, BULK_FRAME, HLEN, PUSH_SOCKBUF, FrameSock, Kind, cap_kernel_queue, decode_error,
                       header, vector_frames)

log = logging.getLogger("dp.tcp")


class _Pending:
    __slots__ = ("fut", "dests", "left")

    def __init__(self, fut: asyncio.Future[None], dests: list[memoryview]) -> None:
        self.fut = fut
        self.dests = dests  # reads: idx -> local slice
        self.left = len(dests)


class TcpPeer(Peer):
    def __init__(self, socks: list[socket.socket], local: RegionTable, remote: EndpointDesc, lp: LocalSide) -> None:
        self.name = remote.node
        self._local = local
        self._remote = remote
        self._timeout = lp.timeout
        self._pending: dict[int, _Pending] = {}
        self._latency: set[int] = set()  # reqs of open latency transfers
        self._reqs = itertools.count(1)
        self._gone_reason = ""
        self._gate: LinkGate = lp.gate  # type: ignore[attr-defined]
        self._handles = [Handles() for _ in TrafficClass]  # per class socket: grant -> handle
        # one connection per class (like one QP per class): bulk bytes queued in kernel
        # buffers never sit in front of a latency frame; the endpoint's gate ranks the
        # classes across connections (gate.py), each sender still runs DRR.
        self.links = [FrameLink(FrameSock(s), lp.weights, self._fail_all, self._gate, c == TrafficClass.BULK)
                      for c, s in zip(TrafficClass, socks, strict=True)]
        for link in self.links:
            link.tasks.spawn(self._recv(link.fs), "dp-tcp-recv")

    @classmethod
    async def open(cls, remote: EndpointDesc, lp: LocalSide) -> TcpPeer:
        loop = asyncio.get_running_loop()
        socks = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in TrafficClass]
        # before connect (sets the window scale): pushes go out, pulled DATA comes in
        cap_kernel_queue(socks[TrafficClass.BULK], send=PUSH_SOCKBUF)
        try:
            for sock in socks:
                sock.setblocking(False)
                await asyncio.wait_for(loop.sock_connect(sock, (remote.host, remote.port)), 10)
                await asyncio.wait_for(initiate(sock, lp.key, remote.node), HANDSHAKE_S)  # type: ignore[attr-defined]
        except (OSError, TimeoutError, AuthFailed) as exc:
            for sock in socks:
                sock.close()
            if isinstance(exc, AuthFailed):
                raise
            raise PeerGone(remote.node, f"connect {remote.host}:{remote.port}: {exc}") from None
        return cls(socks, lp.regions, remote, lp)

    def refresh(self, remote: EndpointDesc) -> None:
        self._remote = remote

    async def write(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None,
                    grant: Grant | None = None) -> None:
        h = self._handle(cls, check_grant(self.name, grant, ops, True))
        if cls == TrafficClass.BULK:  # the bulk socket's thread: few large vectored frames (tcp_wire.py)
            ops = coalesce(ops)
            size = BULK_FRAME
        else:
            size = chunk_for(cls)
        pieces = [(o.remote_offset + p, src[p : p + n]) for o in ops
                  for src in (self._local.resolve(o.local_region, o.local_offset, o.length),)
                  for p, n in split(0, o.length, size)]
        req, fut = self._begin([], cls)
        if cls == TrafficClass.BULK:
            out = vector_frames(cls, req, h, pieces)
        else:
            last = len(pieces) - 1
            out = [([header(Kind.WRITE, cls, ACK_ME if i == last else 0, req, h, i, roff, len(payload)), payload],
                    HLEN + len(payload)) for i, (roff, payload) in enumerate(pieces)]
        self.links[cls].sender.submit_many(cls, out)
        await self._wait(req, fut, sum(o.length for o in ops), timeout)

    async def read(self, ops: list[Op], cls: TrafficClass, *, timeout: float | None = None,
                   grant: Grant | None = None) -> None:
        h = self._handle(cls, check_grant(self.name, grant, ops, False))
        asks = [(h, o, self._local.resolve(o.local_region, o.local_offset, o.length)) for o in ops]
        size = chunk_for(cls)
        pieces = [(rid, o.remote_offset + p, dst[p : p + n]) for rid, o, dst in asks for p, n in split(0, o.length, size)]
        req, fut = self._begin([dst for _, _, dst in pieces], cls)
        self.links[cls].sender.submit_many(cls, [([header(Kind.READ, cls, 0, req, rid, i, roff, len(dst))], HLEN)
                                                 for i, (rid, roff, dst) in enumerate(pieces)])
        await self._wait(req, fut, sum(o.length for o in ops), timeout)

    def _handle(self, cls: TrafficClass, grant: Grant) -> int:
        """The handle `grant` has on class `cls`'s socket; its first use queues a GRANT frame ahead."""
        h, new = self._handles[cls].of(grant.token)
        if new:
            self.links[cls].sender.submit(cls, [header(Kind.GRANT, cls, 0, 0, h, 0, 0, TOKEN), grant.token],
                                          HLEN + TOKEN)
        return h

    def _begin(self, dests: list[memoryview], cls: TrafficClass) -> tuple[int, asyncio.Future[None]]:
        """Register transfer `req`; a latency transfer holds the gate open until it ends."""
        if self._gone_reason:
            raise PeerGone(self.name, self._gone_reason)
        req = next(self._reqs) & 0xFFFFFFFF
        if cls == TrafficClass.LATENCY:
            self._latency.add(req)
            self._gate.open()
        fut = asyncio.get_running_loop().create_future()
        self._pending[req] = _Pending(fut, dests)
        if not dests:
            self._pending[req].left = 1
        return req, fut

    async def _wait(self, req: int, fut: asyncio.Future[None], nbytes: int, timeout: float | None) -> None:
        try:
            async with deadline(timeout if timeout is not None else self._timeout, self.name, nbytes):
                await fut
        finally:
            self._pending.pop(req, None)
            if req in self._latency:
                self._latency.discard(req)
                self._gate.close()

    async def _recv(self, fs: FrameSock) -> None:
        try:
            while True:
                kind, cls, _, req, _, idx, _, n = await fs.read_header()
                await self._on_frame(fs, kind, cls, req, idx, n)
        except (OSError, ConnectionError) as exc:
            self._fail_all(exc)

    async def _on_frame(self, fs: FrameSock, kind: int, cls: int, req: int, idx: int, n: int) -> None:
        p = self._pending.get(req)
        if kind == Kind.DATA:
            if p is None or p.fut.done():
                await fs.skip(n)
                return
            if cls != TrafficClass.LATENCY:
                await self._gate.bulk_turn(n)
            await fs.read_into(p.dests[idx])
            if cls == TrafficClass.LATENCY:
                self._gate.served(n)
            p.left -= 1
            if not p.left:
                p.fut.set_result(None)
        elif kind == Kind.ACK and p is not None and not p.fut.done():
            p.fut.set_result(None)
        elif kind == Kind.ERR:
            err = decode_error(await fs.read_bytes(n), self.name)
            if p is not None and not p.fut.done():
                p.fut.set_exception(err)

    def _fail_all(self, exc: BaseException) -> None:
        self._gone_reason = self._gone_reason or f"{type(exc).__name__}: {exc}"
        for p in self._pending.values():
            if not p.fut.done():
                p.fut.set_exception(PeerGone(self.name, self._gone_reason))

    async def close(self) -> None:
        self._fail_all(ConnectionAbortedError("closed locally"))
        for link in self.links:
            await link.close()


class TcpEndpoint(LocalSide, Endpoint):
    """Listens on host:port; `shm_fast_path` serves same-host peers with ShmPeer."""

    backend = "tcp"

    def __init__(self, node: str, host: str = "127.0.0.1", port: int = 0,
                 weights: Sequence[int] = DEFAULT_WEIGHTS, timeout: float | None = None,
                 shm_fast_path: bool = False, secret: bytes | str | None = None) -> None:
        super().__init__(node, weights, timeout)
        self.host, self.port = host, port
        self.key = key_of(secret)  # None: this process's own secret (tcp_auth.py)
        self.refused = 0  # connections closed because their handshake failed
        self.shm_fast_path = shm_fast_path
        self._tasks = TaskOwner()
        self.gate = LinkGate(self.weights)  # ranks classes across all of this endpoint's links
        self._listener: socket.socket | None = None
        self._conns: list[ServerConn] = []
        self._peers: list[Peer] = []

    async def start(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(128)
        sock.setblocking(False)
        self._listener, self.port = sock, sock.getsockname()[1]
        self._tasks.spawn(self._accept(sock), "dp-tcp-accept")

    async def _accept(self, lsock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, addr = await loop.sock_accept(lsock)
            self._tasks.spawn(self._admit(sock, addr), "dp-tcp-admit")

    async def _admit(self, sock: socket.socket, addr: object) -> None:
        """Serve `sock` only once its initiator proved the mesh secret; else close it unread."""
        sock.setblocking(False)
        try:
            await asyncio.wait_for(accept(sock, self.key, f"{addr}"), HANDSHAKE_S)
        except BaseException as exc:  # refused, timed out, or the endpoint is closing
            if isinstance(exc, (OSError, TimeoutError, AuthFailed)):
                self.refused += 1
                log.warning("data plane %s: refused a connection from %s (%s)", self.node, addr,
                            exc.auth_reason if isinstance(exc, AuthFailed) else type(exc).__name__)
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()
            if isinstance(exc, (OSError, TimeoutError, AuthFailed)):
                return
            raise
        gone = [c for c in self._conns if c.done.is_set()]
        self._conns = [c for c in self._conns if not c.done.is_set()] + [
            ServerConn(sock, self.grants, self.weights, self.gate)]
        for c in gone:  # their initiators left: close the sockets, end their tasks
            await c.close()

    def desc(self) -> EndpointDesc:
        return self.base_desc(host=self.host, port=self.port)

    async def connect(self, remote: EndpointDesc) -> Peer:
        peer: Peer
        if self.shm_fast_path and shm_reachable(self.host_id, remote):
            peer = ShmPeer(self.regions, self.copier, remote, self.timeout)
        else:
            peer = await TcpPeer.open(remote, self)
        self._peers.append(peer)
        return peer

    async def close(self) -> None:
        await self._tasks.aclose()
        if self._listener is not None:
            self._listener.close()
        for c in self._conns:
            await c.close()
        for p in self._peers:
            await p.close()
        self.close_local()
