"""The verbs backend's side channel: one authenticated request and reply per tcp connection."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import struct
from collections.abc import Awaitable, Callable

from .aio import TaskOwner
from .errors import AuthFailed, PeerGone
from .tcp_auth import HANDSHAKE_S, accept, initiate

LEN = struct.Struct("<I")
MAX_BODY = 1 << 20  # a setup message is a few hundred bytes; a longer length is refused
log = logging.getLogger("dp.side")


async def _recv_exact(sock: socket.socket, n: int, peer: str) -> bytes:
    loop, buf, got = asyncio.get_running_loop(), bytearray(n), 0
    while got < n:
        k = await loop.sock_recv_into(sock, memoryview(buf)[got:])
        if not k:
            raise PeerGone(peer, "closed during the verbs setup exchange")
        got += k
    return bytes(buf)


async def _read_body(sock: socket.socket, peer: str) -> bytes:
    (n,) = LEN.unpack(await _recv_exact(sock, LEN.size, peer))
    if n > MAX_BODY:
        raise PeerGone(peer, f"setup message of {n} B is over {MAX_BODY} B")
    return await _recv_exact(sock, n, peer)


class SideChannel:
    """Answers each request with `handle(body)`; a connection failing the handshake is closed unread."""

    def __init__(self, node: str, key: bytes, handle: Callable[[bytes], Awaitable[bytes]]) -> None:
        self.node, self.key, self.handle = node, key, handle
        self.refused = 0  # connections closed because their handshake failed
        self.port = 0
        self._tasks = TaskOwner()
        self._lsock: socket.socket | None = None

    async def start(self, host: str, port: int) -> int:
        sock = socket.create_server((host, port))
        sock.setblocking(False)
        self._lsock, self.port = sock, sock.getsockname()[1]
        self._tasks.spawn(self._accept(sock), "dp-side-accept")
        return self.port

    async def _accept(self, lsock: socket.socket) -> None:
        loop = asyncio.get_running_loop()
        while True:
            sock, addr = await loop.sock_accept(lsock)
            self._tasks.spawn(self._serve(sock, f"{addr}"), "dp-side-serve")

    async def _serve(self, sock: socket.socket, addr: str) -> None:
        loop = asyncio.get_running_loop()
        sock.setblocking(False)
        try:
            try:
                await asyncio.wait_for(accept(sock, self.key, addr), HANDSHAKE_S)
            except (OSError, TimeoutError, AuthFailed) as exc:
                self.refused += 1
                log.warning("verbs side channel %s: refused a connection from %s (%s)", self.node, addr,
                            exc.auth_reason if isinstance(exc, AuthFailed) else type(exc).__name__)
                return
            body = await asyncio.wait_for(_read_body(sock, addr), HANDSHAKE_S)
            answer = await self.handle(body)
            await loop.sock_sendall(sock, LEN.pack(len(answer)) + answer)
        except Exception as exc:  # noqa: BLE001 - a failed setup (or a device error) ends only this connection
            log.warning("verbs side channel %s: setup from %s failed (%s: %s)", self.node, addr,
                        type(exc).__name__, exc)
        finally:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            sock.close()

    async def close(self) -> None:
        await self._tasks.aclose()
        if self._lsock is not None:
            self._lsock.close()


async def exchange(host: str, port: int, key: bytes, peer: str, body: bytes, timeout: float = 10.0) -> bytes:
    """Connect, prove the secret, send `body`, return the reply (AuthFailed / PeerGone on failure)."""
    loop = asyncio.get_running_loop()
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setblocking(False)
    try:
        await asyncio.wait_for(loop.sock_connect(sock, (host, port)), timeout)
        await asyncio.wait_for(initiate(sock, key, peer), HANDSHAKE_S)
        await loop.sock_sendall(sock, LEN.pack(len(body)) + body)
        return await asyncio.wait_for(_read_body(sock, peer), timeout)
    except AuthFailed:
        raise
    except (OSError, TimeoutError) as exc:
        raise PeerGone(peer, f"verbs setup {host}:{port}: {type(exc).__name__}: {exc}") from None
    finally:
        sock.close()
