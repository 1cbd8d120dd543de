"""The tcp data plane's handshake: both ends prove they hold the mesh secret before any frame.

HMAC-SHA256 over fresh nonces from both ends: authenticated, not encrypted. An endpoint given
no secret uses its own process's, so it never accepts a stranger.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import secrets
import socket

from .errors import AuthFailed

MAGIC = b"DPA1"
NONCE = 32
MAC = 32
HANDSHAKE_S = 10.0  # a connection that does not finish the handshake in time is closed
_PROCESS_SECRET = secrets.token_bytes(32)  # the secret of endpoints that were given none


def key_of(secret: bytes | str | None) -> bytes:
    """The HMAC key of a mesh secret (domain-separated, so the raw secret is never the key)."""
    raw = _PROCESS_SECRET if not secret else secret.encode() if isinstance(secret, str) else secret
    return hmac.new(raw, b"dualpath data plane v1", hashlib.sha256).digest()


def _mac(key: bytes, role: bytes, a: bytes, b: bytes) -> bytes:
    return hmac.new(key, role + a + b, hashlib.sha256).digest()


async def _recv_exact(sock: socket.socket, n: int, peer: str) -> bytes:
    loop, buf, got = asyncio.get_running_loop(), bytearray(n), 0
    view = memoryview(buf)
    while got < n:
        k = await loop.sock_recv_into(sock, view[got:])
        if not k:
            raise AuthFailed(peer, "connection closed during the handshake")
        got += k
    return bytes(buf)


async def accept(sock: socket.socket, key: bytes, peer: str = "initiator") -> None:
    """Server side; raises AuthFailed (the caller closes the socket) unless the initiator proved the key."""
    loop = asyncio.get_running_loop()
    ns = secrets.token_bytes(NONCE)
    await loop.sock_sendall(sock, MAGIC + ns)
    answer = await _recv_exact(sock, NONCE + MAC, peer)
    nc, mac = answer[:NONCE], answer[NONCE:]
    if not hmac.compare_digest(mac, _mac(key, b"client", ns, nc)):
        raise AuthFailed(peer, "the initiator does not hold this mesh's data-plane secret")
    await loop.sock_sendall(sock, _mac(key, b"server", nc, ns))


async def initiate(sock: socket.socket, key: bytes, peer: str) -> None:
    """Initiator side; raises AuthFailed unless the server is of the same mesh (and let us in)."""
    loop = asyncio.get_running_loop()
    hello = await _recv_exact(sock, len(MAGIC) + NONCE, peer)
    if hello[: len(MAGIC)] != MAGIC:
        raise AuthFailed(peer, "not a dualpath data-plane endpoint")
    ns, nc = hello[len(MAGIC):], secrets.token_bytes(NONCE)
    await loop.sock_sendall(sock, nc + _mac(key, b"client", ns, nc))
    try:
        mac = await _recv_exact(sock, MAC, peer)
    except AuthFailed:
        raise AuthFailed(peer, "refused by the server: the endpoints hold different data-plane secrets") from None
    if not hmac.compare_digest(mac, _mac(key, b"server", nc, ns)):
        raise AuthFailed(peer, "the server does not hold this mesh's data-plane secret")
