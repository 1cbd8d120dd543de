"""One conformance suite for every data-plane backend (shm, tcp, verbs).

Each test builds two endpoints ("pe" and "de") in one process with shm-backed regions
and checks the contract of shared/transport/base.py: bytes land exactly, errors are
typed, a gone peer fails fast, both classes and concurrent transfers work. The verbs
parameter is skipped with the probe's reason where no RDMA device exists.
"""

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import msgspec
import pytest

from shared.transport import (
    Endpoint, Op, OutOfBounds, PeerGone, RegionNotFound, ShmRegion, TrafficClass, TransferTimeout,
    create_endpoint, new_name,
)
from shared.transport.verbs import probe

pytestmark = pytest.mark.integration
SIZE = 4 << 20
L, B = TrafficClass.LATENCY, TrafficClass.BULK
_VERBS_REASON = probe()
BACKENDS = [
    "shm",
    "tcp",
    pytest.param("verbs", marks=pytest.mark.skipif(_VERBS_REASON is not None, reason=f"verbs: {_VERBS_REASON}")),
]


class Pair:
    def __init__(self, pe: Endpoint, de: Endpoint, segs: dict[str, ShmRegion]) -> None:
        self.pe, self.de, self.segs = pe, de, segs

    def fill(self, name: str) -> bytes:
        data = os.urandom(SIZE)
        self.segs[name].buf[:] = data
        return data


@contextlib.asynccontextmanager
async def pair(backend: str, **opts: object) -> AsyncIterator[Pair]:
    pe = create_endpoint(backend, node="pe", timeout=5.0, **opts)
    de = create_endpoint(backend, node="de", timeout=5.0, **opts)
    segs = {n: ShmRegion.create(new_name(n), SIZE) for n in ("pe.kv", "pe.buf", "de.buf")}
    try:
        pe.register("kv", segs["pe.kv"].buf, shm_name=segs["pe.kv"].name)
        await pe.start()
        await de.start()
        pe.register("buf", segs["pe.buf"].buf, shm_name=segs["pe.buf"].name)  # after start
        de.register("buf", segs["de.buf"].buf, shm_name=segs["de.buf"].name)
        yield Pair(pe, de, segs)
    finally:
        await pe.close()
        await de.close()
        for s in segs.values():
            s.close()
            s.unlink()


def small_ops(n: int, size: int, stride: int) -> list[Op]:
    return [Op("kv", i * stride, "buf", SIZE - (i + 1) * stride, size) for i in range(n)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls", [L, B])
def test_many_small_ops_write_then_read_exact_bytes(backend, cls):
    async def main() -> None:
        async with pair(backend) as p:
            src = p.fill("pe.kv")
            peer = await p.pe.connect(p.de.desc())
            ops = small_ops(500, 3000, 4096)
            await peer.write(ops, cls)
            de = p.segs["de.buf"].buf
            for o in ops:
                assert de[o.remote_offset : o.remote_offset + o.length] == src[o.local_offset : o.local_offset + o.length]
            p.segs["pe.kv"].buf[:] = bytes(SIZE)
            await peer.read(ops, cls)
            kv = p.segs["pe.kv"].buf
            for o in ops:
                assert kv[o.local_offset : o.local_offset + o.length] == src[o.local_offset : o.local_offset + o.length]

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_few_large_ops_cross_chunk_boundaries(backend):
    async def main() -> None:
        async with pair(backend) as p:
            p.fill("pe.kv")
            remote = p.fill("de.buf")
            peer = await p.pe.connect(p.de.desc())
            await peer.write([Op("kv", 0, "buf", 1, 3_000_001), Op("kv", 3_000_001, "buf", 3_000_002, 1_000_000)], B)
            assert p.segs["de.buf"].buf[1:4_000_002] == p.segs["pe.kv"].buf[0:4_000_001]
            assert p.segs["de.buf"].buf[0] == remote[0]
            await peer.read([Op("buf", 0, "buf", 0, SIZE)], L)
            assert p.segs["pe.buf"].buf == p.segs["de.buf"].buf

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy_local_moves_bytes_between_own_regions(backend):
    async def main() -> None:
        async with pair(backend) as p:
            src = p.fill("pe.buf")
            await p.pe.copy_local([Op("buf", 0, "kv", 100, 1 << 20), Op("buf", 5, "kv", 0, 7)], L)
            kv = p.segs["pe.kv"].buf
            assert kv[100 : 100 + (1 << 20)] == src[0 : 1 << 20] and kv[0:7] == src[5:12]

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_regions_and_bounds_raise_typed_errors(backend):
    async def main() -> None:
        async with pair(backend) as p:
            peer = await p.pe.connect(p.de.desc())
            with pytest.raises(RegionNotFound) as e:
                await peer.write([Op("kv", 0, "nope", 0, 1)], L)
            assert (e.value.name, e.value.where) == ("nope", "remote")
            with pytest.raises(RegionNotFound) as e:
                await peer.read([Op("nope", 0, "buf", 0, 1)], L)
            assert e.value.name == "nope"
            with pytest.raises(OutOfBounds) as oob:
                await peer.write([Op("kv", 0, "buf", SIZE - 1, 2)], B)
            assert (oob.value.region, oob.value.offset, oob.value.length, oob.value.size) == ("buf", SIZE - 1, 2, SIZE)
            with pytest.raises(OutOfBounds):
                await peer.read([Op("kv", SIZE, "buf", 0, 1)], L)
            with pytest.raises(OutOfBounds):
                await p.pe.copy_local([Op("kv", 0, "buf", -1, 1)], L)
            # a stale / lying announcement: the remote side's own check still refuses
            desc = p.de.desc()
            desc.regions = [msgspec.structs.replace(r, size=2 * SIZE) for r in desc.regions]
            peer.refresh(desc)
            with pytest.raises(OutOfBounds):
                await peer.write([Op("kv", 0, "buf", SIZE, 16)], L)
            await peer.write([Op("kv", 0, "buf", 0, 16)], L)  # the link still works

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_regions_registered_after_connect_are_reachable_after_refresh(backend):
    async def main() -> None:
        async with pair(backend) as p:
            peer = await p.pe.connect(p.de.desc())
            late = ShmRegion.create(new_name("late"), 4096)
            try:
                p.de.register("late", late.buf, shm_name=late.name)
                with pytest.raises(RegionNotFound):
                    await peer.write([Op("kv", 0, "late", 0, 8)], L)
                peer.refresh(p.de.desc())
                p.segs["pe.kv"].buf[:8] = b"12345678"
                await peer.write([Op("kv", 0, "late", 0, 8)], L)
                assert bytes(late.buf[:8]) == b"12345678"
                await peer.close()
            finally:
                late.close()
                late.unlink()

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_transfers_in_both_classes(backend):
    async def main() -> None:
        async with pair(backend) as p:
            src = p.fill("pe.kv")
            peer = await p.pe.connect(p.de.desc())
            part = SIZE // 8
            jobs = [
                peer.write([Op("kv", i * part, "buf", i * part, part)], L if i % 2 else B) for i in range(8)
            ]
            await asyncio.gather(*jobs)
            assert p.segs["de.buf"].buf == src
            p.segs["pe.kv"].buf[:] = bytes(SIZE)
            await asyncio.gather(*[peer.read(small_ops(64, 1000, 2048)[i::4], (L, B)[i % 2]) for i in range(4)])

    asyncio.run(main())


@pytest.mark.parametrize("backend", BACKENDS)
def test_peer_gone_fails_fast_not_hang(backend):
    async def main() -> None:
        async with pair(backend) as p:
            peer = await p.pe.connect(p.de.desc())
            await peer.write([Op("kv", 0, "buf", 0, 64)], L)
            await p.de.close()  # whether the PE side has seen it yet or not, nothing hangs
            with pytest.raises((PeerGone, TransferTimeout)):
                await peer.write([Op("kv", 0, "buf", 0, 1 << 20)], B, timeout=2.0)
            with pytest.raises((PeerGone, TransferTimeout)):
                await peer.read([Op("kv", 0, "buf", 0, 64)], L, timeout=2.0)

    asyncio.run(main())


def test_connect_to_a_dead_address_is_peer_gone():
    async def main() -> None:
        async with pair("tcp") as p:
            desc = p.de.desc()
            await p.de.close()
            with pytest.raises(PeerGone):
                await p.pe.connect(desc)

    asyncio.run(main())


def test_auto_uses_shm_fast_path_on_the_same_host():
    async def main() -> None:
        async with pair("auto") as p:
            src = p.fill("pe.kv")
            peer = await p.pe.connect(p.de.desc())
            assert type(peer).__name__ == "ShmPeer"
            await peer.write([Op("kv", 0, "buf", 0, SIZE)], B)
            assert p.segs["de.buf"].buf == src

    asyncio.run(main())


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown transport backend"):
        create_endpoint("carrier-pigeon")
