"""The tcp server's threaded bulk receive (tcp_bulk.py): exact bytes, typed errors, clean shutdown."""

import asyncio
import os
import threading

import msgspec
import pytest

from shared.transport import NotGranted, Op, ShmRegion, TrafficClass, create_endpoint, new_name

pytestmark = pytest.mark.integration
SIZE = 4 << 20
B = TrafficClass.BULK


def bulk_threads() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "dp-tcp-bulk-rx"]


def test_bulk_pushes_land_on_the_reader_thread_and_refusals_come_back_typed():
    async def main() -> None:
        pe, de = create_endpoint("tcp", node="pe", timeout=5.0), create_endpoint("tcp", node="de", timeout=5.0)
        kv, buf = ShmRegion.create(new_name("kv"), SIZE), ShmRegion.create(new_name("buf"), SIZE)
        try:
            await pe.start()
            await de.start()
            pe.register("kv", kv.buf)
            de.register("buf", buf.buf)
            data = os.urandom(SIZE)
            kv.buf[:] = data
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
        finally:
            await pe.close()
            await de.close()
            for r in (kv, buf):
                r.close()
                r.unlink()
        assert not bulk_threads()  # closing ends the reader thread

    asyncio.run(main())
