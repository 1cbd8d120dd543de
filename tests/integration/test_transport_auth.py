"""The tcp data plane lets no stranger in (tcp_auth.py, regions.py).

Real sockets, raw bytes: a stranger on the port gets the challenge and then EOF, its
frames never touch a region; a peer holding another mesh's secret is refused; a server
that cannot prove the secret is refused by the initiator; an authenticated peer reaches
only regions registered with remote=True.
"""

import asyncio
import contextlib
import os
import socket
from collections.abc import AsyncIterator

import pytest

from shared.transport import AuthFailed, Op, RegionNotFound, ShmRegion, TrafficClass, create_endpoint, new_name
from shared.transport.tcp_auth import MAGIC, NONCE, initiate, key_of
from shared.transport.tcp_wire import HLEN, HEADER, Kind, decode_error, header

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
                await peer.write([Op("kv", 0, "buf", 0, SIZE)], L)
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


def test_an_authenticated_peer_reaches_only_regions_granted_to_peers():
    async def main() -> None:
        async with server("mesh-a") as (de, _, kv):
            assert [r.name for r in de.desc().regions] == ["buf"]  # the local region is not announced
            kv_rid = de.regions.desc("kv").rid
            loop = asyncio.get_running_loop()
            sock = socket.socket()
            sock.setblocking(False)
            try:
                await loop.sock_connect(sock, ("127.0.0.1", de.port))
                await initiate(sock, key_of("mesh-a"), "de")
                # a READ and a WRITE naming kv's wire id, as a buggy or curious member would send them
                await loop.sock_sendall(sock, header(Kind.READ, L, 0, 1, kv_rid, 0, 0, 64)
                                        + header(Kind.WRITE, L, 1, 2, kv_rid, 0, 0, 64) + b"\x00" * 64)
                answers = []
                for _ in range(2):
                    hdr = b""
                    while len(hdr) < HLEN:
                        hdr += await loop.sock_recv(sock, HLEN - len(hdr))
                    kind, _, _, req, _, _, _, n = HEADER.unpack(hdr)
                    body = b""
                    while len(body) < n:
                        body += await loop.sock_recv(sock, n - len(body))
                    answers.append((kind, req, decode_error(body).code if kind == Kind.ERR else None))
                assert sorted(answers) == [(Kind.ERR, 1, 1), (Kind.ERR, 2, 1)]  # region not found, both
                assert bytes(kv.buf[:64]) == b"\xcd" * 64
            finally:
                sock.close()
            pe = create_endpoint("tcp", node="pe", timeout=5.0, secret="mesh-a")
            try:
                await pe.start()
                pe.register("mine", bytearray(64))
                peer = await pe.connect(de.desc())
                with pytest.raises(RegionNotFound):
                    await peer.read([Op("mine", 0, "kv", 0, 64)], L)
            finally:
                await pe.close()

    asyncio.run(main())
