"""The data plane lets no stranger in (tcp_auth.py, grants.py, side_channel.py).

Real sockets, raw bytes: a stranger on the port gets the challenge and then EOF, its
frames never touch a region; a peer holding another mesh's secret is refused; a server
that cannot prove the secret is refused by the initiator; an authenticated peer reaches
only the byte ranges a live grant covers (never the local KV region, nothing after the
grant is revoked, nothing more by forging a grant's ranges); the verbs backend's setup
side channel refuses strangers and other meshes before it reads a setup message.
"""

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator

import pytest

import msgspec

from shared.transport import (AuthFailed, NotGranted, Op, PeerGone, RegionNotFound, ShmRegion, TrafficClass,
                              create_endpoint, new_name)
from shared.transport.grants import TOKEN
from shared.transport.side_channel import SideChannel, exchange
from shared.transport.tcp_auth import MAGIC, NONCE, initiate, key_of
from shared.transport.tcp_wire import HLEN, HEADER, Kind, WireError, header

pytestmark = pytest.mark.integration
SIZE = 1 << 20
L = TrafficClass.LATENCY


@contextlib.asynccontextmanager
async def server(secret: str) -> AsyncIterator[tuple[object, ShmRegion, ShmRegion]]:
    """A "de" endpoint with a remote "buf" and a local-only "kv", both filled with known bytes."""
    de = create_endpoint("tcp", node="de", timeout=5.0, secret=secret)
    buf, kv = ShmRegion.create(new_name("buf"), SIZE), ShmRegion.create(new_name("kv"), SIZE)
    buf.buf[:] = b"\xab" * SIZE
    kv.buf[:] = b"\xcd" * SIZE
    try:
        await de.start()
        de.register("buf", buf.buf)
        de.register("kv", kv.buf, remote=False)
        yield de, buf, kv
    finally:
        await de.close()
        for r in (buf, kv):
            r.close()
            r.unlink()


async def raw_exchange(port: int, send: bytes) -> tuple[bytes, bytes]:
    """Connect, read the 36-byte challenge, send `send`, read everything until EOF."""
    loop = asyncio.get_running_loop()
    sock = socket.socket()
    sock.setblocking(False)
    try:
        await loop.sock_connect(sock, ("127.0.0.1", port))
        hello = b""
        while len(hello) < len(MAGIC) + NONCE:
            hello += await loop.sock_recv(sock, len(MAGIC) + NONCE - len(hello))
        with contextlib.suppress(ConnectionResetError, BrokenPipeError):
            await loop.sock_sendall(sock, send)
        rest = b""
        with contextlib.suppress(ConnectionResetError):
            while chunk := await loop.sock_recv(sock, 65536):
                rest += chunk
        return hello, rest
    finally:
        sock.close()


def test_a_stranger_on_the_port_can_neither_write_nor_read():
    async def main() -> None:
        async with server("mesh-a") as (de, buf, _):
            rid = de.desc().region("buf").rid
            # write: a WRITE frame with a payload for "buf", sent where the handshake answer goes
            write = header(Kind.WRITE, L, 1, 1, rid, 0, 0, 64) + b"\x00" * 64
            hello, rest = await raw_exchange(de.port, write)
            assert hello.startswith(MAGIC) and b"buf" not in hello
            assert rest == b""  # closed: no ACK, no ERR, nothing naming a region
            assert bytes(buf.buf[:64]) == b"\xab" * 64
            # read: READ frames for "buf"
            read = header(Kind.READ, L, 0, 2, rid, 0, 0, 4096) * 2
            _, rest = await raw_exchange(de.port, read)
            assert rest == b""
            assert de.refused == 2

    asyncio.run(main())


def test_a_peer_of_another_mesh_is_refused_and_touches_nothing():
    async def main() -> None:
        async with server("mesh-a") as (de, buf, _):
            pe = create_endpoint("tcp", node="pe", timeout=5.0, secret="mesh-b")
            src = ShmRegion.create(new_name("src"), SIZE)
            try:
                await pe.start()
                pe.register("kv", src.buf)
                with pytest.raises(AuthFailed) as e:
                    await pe.connect(de.desc())
                assert e.value.peer == "de" and "different data-plane secrets" in e.value.auth_reason
                assert "mesh-a" not in str(e.value) and "mesh-b" not in str(e.value)
                assert de.refused == 1 and bytes(buf.buf[:16]) == b"\xab" * 16
            finally:
                await pe.close()
                src.close()
                src.unlink()

    asyncio.run(main())


def test_the_same_secret_connects_and_moves_exact_bytes():
    async def main() -> None:
        async with server("mesh-a") as (de, buf, _):
            pe = create_endpoint("tcp", node="pe", timeout=5.0, secret="mesh-a")
            src = ShmRegion.create(new_name("src"), SIZE)
            try:
                await pe.start()
                pe.register("kv", src.buf)
                data = os.urandom(SIZE)
                src.buf[:] = data
                peer = await pe.connect(de.desc())
                await peer.write([Op("kv", 0, "buf", 0, SIZE)], L, grant=de.grant("buf"))
                assert bytes(buf.buf) == data and de.refused == 0
            finally:
                await pe.close()
                src.close()
                src.unlink()

    asyncio.run(main())


def test_an_initiator_refuses_a_server_that_cannot_prove_the_secret():
    async def main() -> None:
        loop = asyncio.get_running_loop()
        lsock = socket.create_server(("127.0.0.1", 0))
        lsock.setblocking(False)
        port = lsock.getsockname()[1]

        async def impostor() -> None:  # says hello, takes the answer, replies with a made-up proof
            conn, _ = await loop.sock_accept(lsock)
            conn.setblocking(False)
            await loop.sock_sendall(conn, MAGIC + os.urandom(NONCE))
            got = b""
            while len(got) < 64:
                got += await loop.sock_recv(conn, 64 - len(got))
            await loop.sock_sendall(conn, os.urandom(32))
            await loop.sock_recv(conn, 1)
            conn.close()

        task = asyncio.create_task(impostor())
        sock = socket.socket()
        sock.setblocking(False)
        await loop.sock_connect(sock, ("127.0.0.1", port))
        with pytest.raises(AuthFailed, match="server does not hold"):
            await initiate(sock, key_of("mesh-a"), "impostor")
        sock.close()
        await task
        lsock.close()

    asyncio.run(main())


async def answers(sock: socket.socket, count: int) -> list[tuple[int, int, int | None, bytes]]:
    """`count` frames from the server: (kind, req, error code or None, payload)."""
    loop, out = asyncio.get_running_loop(), []
    for _ in range(count):
        hdr = b""
        while len(hdr) < HLEN:
            hdr += await loop.sock_recv(sock, HLEN - len(hdr))
        kind, _, _, req, _, _, _, n = HEADER.unpack(hdr)
        body = b""
        while len(body) < n:
            body += await loop.sock_recv(sock, n - len(body))
        code = msgspec.msgpack.decode(body, type=WireError).code if kind == Kind.ERR else None
        out.append((kind, req, code, body))
    return sorted(out, key=lambda a: a[1])


def test_an_authenticated_peer_reaches_only_what_a_live_grant_covers():
    async def main() -> None:
        async with server("mesh-a") as (de, buf, kv):
            assert [r.name for r in de.desc().regions] == ["buf"]  # the local region is not announced
            with pytest.raises(RegionNotFound):
                de.grant("kv")  # and no grant can ever open it
            kv_rid, buf_rid = de.regions.desc("kv").rid, de.regions.desc("buf").rid
            g = de.grant("buf", [(4096, 4096)])
            loop = asyncio.get_running_loop()
            sock = socket.socket()
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, ("127.0.0.1", de.port))
                await initiate(sock, key_of("mesh-a"), "de")
                # as a buggy or curious member would send them: region ids, no grant bound
                await loop.sock_sendall(sock, header(Kind.READ, L, 0, 1, kv_rid, 0, 0, 64)
                                        + header(Kind.WRITE, L, 1, 2, buf_rid, 0, 4096, 64) + b"\x00" * 64)
                assert [(k, r, c) for k, r, c, _ in await answers(sock, 2)] == [(Kind.ERR, 1, 4), (Kind.ERR, 2, 4)]
                # a made-up token binds but opens nothing; the real one opens exactly its range
                await loop.sock_sendall(sock, header(Kind.GRANT, L, 0, 0, 7, 0, 0, TOKEN) + os.urandom(TOKEN)
                                        + header(Kind.GRANT, L, 0, 0, 8, 0, 0, TOKEN) + g.token
                                        + header(Kind.READ, L, 0, 3, 7, 0, 4096, 64)
                                        + header(Kind.READ, L, 0, 4, 8, 0, 4096, 64)
                                        + header(Kind.READ, L, 0, 5, 8, 0, 8000, 200)
                                        + header(Kind.WRITE, L, 1, 6, 8, 0, 0, 64) + b"\x00" * 64)
                got = await answers(sock, 4)
                assert [(k, r, c) for k, r, c, _ in got] == [(Kind.ERR, 3, 4), (Kind.DATA, 4, None),
                                                             (Kind.ERR, 5, 4), (Kind.ERR, 6, 4)]
                assert got[1][3] == b"\xab" * 64
                assert de.revoke(g) and not de.revoke(g)
                await loop.sock_sendall(sock, header(Kind.READ, L, 0, 7, 8, 0, 4096, 64))
                assert [(k, c) for k, _, c, _ in await answers(sock, 1)] == [(Kind.ERR, 4)]
                assert bytes(kv.buf[:64]) == b"\xcd" * 64 and bytes(buf.buf) == b"\xab" * SIZE
            finally:
                sock.close()
            pe = create_endpoint("tcp", node="pe", timeout=5.0, secret="mesh-a")
            try:
                await pe.start()
                pe.register("mine", bytearray(SIZE))
                peer = await pe.connect(de.desc())
                g = de.grant("buf", [(0, 4096)])
                forged = msgspec.structs.replace(g, starts=[0], ends=[SIZE])  # the holder widens its ranges
                with pytest.raises(NotGranted, match="refused by de"):
                    await peer.write([Op("mine", 0, "buf", 8192, 64)], L, grant=forged)
                with pytest.raises(NotGranted, match="refused by de"):  # the bulk socket's thread checks too
                    await peer.write([Op("mine", 0, "buf", 8192, 1 << 19)], TrafficClass.BULK, grant=forged)
                await peer.write([Op("mine", 0, "buf", 0, 4096)], TrafficClass.BULK, grant=forged)  # in step
                assert bytes(buf.buf[:4096]) == bytes(4096) and bytes(buf.buf[4096:]) == b"\xab" * (SIZE - 4096)
            finally:
                await pe.close()

    asyncio.run(main())


async def _echo(body: bytes) -> bytes:
    return b"reply:" + body


def test_the_verbs_side_channel_refuses_strangers_and_other_meshes_before_any_setup():
    async def main() -> None:
        seen: list[bytes] = []

        async def handle(body: bytes) -> bytes:
            seen.append(body)
            return await _echo(body)

        side = SideChannel("de", key_of("mesh-a"), handle)
        port = await side.start("127.0.0.1", 0)
        try:
            hello, rest = await raw_exchange(port, b"\x10\x00\x00\x00" + b"ConnectRequest..")
            assert hello.startswith(MAGIC) and rest == b""  # no QP numbers, no regions
            with pytest.raises(AuthFailed, match="different data-plane secrets"):
                await exchange("127.0.0.1", port, key_of("mesh-b"), "de", b"ConnectRequest")
            assert not seen and side.refused == 2
            assert await exchange("127.0.0.1", port, key_of("mesh-a"), "de", b"hi") == b"reply:hi"
            assert seen == [b"hi"]
        finally:
            await side.close()
        with pytest.raises(PeerGone):
            await exchange("127.0.0.1", port, key_of("mesh-a"), "de", b"hi")

    asyncio.run(main())
