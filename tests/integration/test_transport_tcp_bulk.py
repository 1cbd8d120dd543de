"""The tcp server's threaded bulk receive (tcp_bulk.py): exact bytes, typed errors, clean shutdown,
vectored pushes checked whole before a byte lands, malformed ones dropping only their socket."""

import asyncio
import contextlib
import os
import socket
import threading

import msgspec
import pytest

from shared.transport import NotGranted, Op, ShmRegion, TrafficClass, create_endpoint, new_name
from shared.transport.grants import TOKEN
from shared.transport.tcp_auth import initiate, key_of
from shared.transport.tcp_wire import MAX_SEGS, SEG, Kind, header

pytestmark = pytest.mark.integration
SIZE = 4 << 20
B = TrafficClass.BULK


def bulk_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dp-tcp-bulk-rx"]


@contextlib.asynccontextmanager
async def pair(**kw):
    """Two started tcp endpoints, `kv` (random bytes) registered on pe and `buf` (zeros) on de."""
    pe, de = create_endpoint("tcp", node="pe", timeout=5.0, **kw), create_endpoint("tcp", node="de", timeout=5.0, **kw)
    kv, buf = ShmRegion.create(new_name("kv"), SIZE), ShmRegion.create(new_name("buf"), SIZE)
    try:
        await pe.start()
        await de.start()
        pe.register("kv", kv.buf)
        de.register("buf", buf.buf)
        kv.buf[:] = data = os.urandom(SIZE)
        buf.buf[:] = bytes(SIZE)
        yield pe, de, kv, buf, data
    finally:
        await pe.close()
        await de.close()
        for r in (kv, buf):
            r.close()
            r.unlink()


def test_bulk_pushes_land_on_the_reader_thread_and_refusals_come_back_typed():
    async def main() -> None:
        async with pair() as (pe, de, kv, buf, data):
            peer = await pe.connect(de.desc())
            g = de.grant("buf")
            ops = [Op("kv", i * 98304, "buf", SIZE - (i + 1) * 98304, 98304) for i in range(40)]
            await peer.write(ops, B, grant=g)
            assert len(bulk_threads()) == 1  # the bulk socket is served by its thread
            for o in ops:
                assert buf.buf[o.remote_offset : o.remote_offset + o.length] == data[o.local_offset : o.local_offset + o.length]
            forged = msgspec.structs.replace(g, ends=[2 * SIZE])  # the initiator's copy lies
            with pytest.raises(NotGranted) as ng:  # refused by the thread, payload skipped
                await peer.write([Op("kv", 0, "buf", SIZE, 100_001)], B, grant=forged)
            assert (ng.value.region, ng.value.offset, ng.value.length) == ("buf", SIZE, 100_001)
            await peer.write([Op("kv", 0, "buf", 0, 300_000)], B, grant=g)  # the stream is still in step
            assert buf.buf[:300_000] == data[:300_000]
        assert not bulk_threads()  # closing ends the reader thread

    asyncio.run(main())


def test_a_vectored_push_is_checked_whole_before_a_byte_lands_and_a_malformed_one_drops_only_its_socket():
    async def main() -> None:
        async with pair(secret="m") as (pe, de, kv, buf, data):
            peer = await pe.connect(de.desc())
            g = de.grant("buf", [(0, SIZE // 2)])
            forged = msgspec.structs.replace(g, ends=[SIZE])
            # one WRITEV frame: segment 0 is granted, segment 1 is not -> nothing of it lands
            ops = [Op("kv", 0, "buf", 0, 4096), Op("kv", 8192, "buf", SIZE - 4096, 4096)]
            with pytest.raises(NotGranted):
                await peer.write(ops, B, grant=forged)
            assert bytes(buf.buf) == bytes(SIZE)
            # 40 scattered pieces and one contiguous run of 48: every byte where it belongs
            ops = [Op("kv", i * 4096, "buf", (SIZE // 2) - (i + 1) * 4096, 4096) for i in range(40)]
            ops += [Op("kv", 1 << 20, "buf", 0, 4096 * 48)]
            await peer.write([*ops[:40], *[Op("kv", (1 << 20) + i * 4096, "buf", i * 4096, 4096) for i in range(48)]],
                             B, grant=g)
            for o in ops:
                assert buf.buf[o.remote_offset : o.remote_offset + o.length] == data[o.local_offset : o.local_offset + o.length]

            for bad in (header(Kind.WRITEV, B, 1, 1, 9, 2, 0, 100) + SEG.pack(0, 32) + SEG.pack(64, 32),  # sums to 64
                        header(Kind.WRITEV, B, 1, 1, 9, MAX_SEGS + 1, 0, 64)):  # too many segments
                sock = socket.socket()
                sock.setblocking(False)
                loop = asyncio.get_running_loop()
                try:
                    await loop.sock_connect(sock, ("127.0.0.1", de.port))
                    await initiate(sock, key_of("m"), "de")
                    await loop.sock_sendall(sock, header(Kind.GRANT, B, 0, 0, 9, 0, 0, TOKEN) + g.token + bad)
                    assert await loop.sock_recv(sock, 4096) == b""  # the server closed this socket
                finally:
                    sock.close()
            await peer.write([Op("kv", 0, "buf", 0, 4096)], B, grant=g)  # the endpoint still serves others
            assert bytes(buf.buf[:4096]) == data[:4096]

    asyncio.run(main())
