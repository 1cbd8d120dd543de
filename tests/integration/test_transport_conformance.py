"""One conformance suite for every data-plane backend (shm, tcp, verbs).

Each test builds two endpoints ("pe" and "de") in one process with shm-backed regions
and checks the contract of shared/transport/base.py: bytes land exactly, errors are
typed, a gone peer fails fast, both classes and concurrent transfers work, a transfer
reaches only what its grant covers. "tcp-netns" runs the tcp suite between two hosts
that are network namespaces on tc-shaped links (skipped with the reason where they
cannot be made); the verbs parameter is skipped with the probe's reason where no RDMA
device exists.
"""

import asyncio
import contextlib
import os
from collections.abc import AsyncIterator

import msgspec
import pytest

from shared.transport import (
    Endpoint, NotGranted, Op, OutOfBounds, PeerGone, RegionNotFound, ShmRegion, TrafficClass, TransferTimeout,
    create_endpoint, new_name,
)
from dualpath.netns.nsenter import entered
from shared.transport.verbs import probe

from .netnsutil import Hosts, run_in

pytestmark = pytest.mark.integration
SIZE = 4 << 20
L, B = TrafficClass.LATENCY, TrafficClass.BULK
_VERBS_REASON = probe()
BACKENDS = [
    "shm",
    "tcp",
    "tcp-netns",  # tcp between two hosts that are network namespaces (conftest: netns_hosts)
    pytest.param("verbs", marks=pytest.mark.skipif(_VERBS_REASON is not None, reason=f"verbs: {_VERBS_REASON}")),
]


class Pair:
    def __init__(self, pe: Endpoint, de: Endpoint, segs: dict[str, ShmRegion]) -> None:
        self.pe, self.de, self.segs = pe, de, segs
        self.g = de.grant("buf")  # all of the DE's buffer, both directions

    def fill(self, name: str) -> bytes:
        data = os.urandom(SIZE)
        self.segs[name].buf[:] = data
        return data


HOSTS: Hosts | None = None  # set for the tcp-netns parameter


@pytest.fixture(autouse=True)
def _hosts(request):
    """tcp-netns: the test runs on a thread inside host "a"; the DE endpoint lives on host "b"."""
    global HOSTS
    backend = getattr(request.node, "callspec", None) and request.node.callspec.params.get("backend")
    HOSTS = request.getfixturevalue("netns_hosts") if backend == "tcp-netns" else None


def go(backend: str, main) -> None:
    if backend == "tcp-netns":
        run_in(HOSTS.a.ns, main)
    else:
        asyncio.run(main())


@contextlib.asynccontextmanager
async def pair(backend: str, **opts: object) -> AsyncIterator[Pair]:
    if backend == "tcp-netns":  # this thread is in host a; the DE's listener is made in host b
        pe = create_endpoint("tcp", node="pe", host=HOSTS.a.ip, timeout=5.0, **opts)
        with entered(HOSTS.b.ns):
            de = create_endpoint("tcp", node="de", host=HOSTS.b.ip, timeout=5.0, **opts)
            await de.start()  # binds and spawns, no await inside: done before the block ends
        assert pe.host_id != de.host_id  # two hosts to the data plane
    else:
        pe = create_endpoint(backend, node="pe", timeout=5.0, **opts)
        de = create_endpoint(backend, node="de", timeout=5.0, **opts)
    segs = {n: ShmRegion.create(new_name(n), SIZE) for n in ("pe.kv", "pe.buf", "de.buf")}
    try:
        pe.register("kv", segs["pe.kv"].buf, shm_name=segs["pe.kv"].name)
        await pe.start()
        if backend != "tcp-netns":
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
            await peer.write(ops, cls, grant=p.g)
            de = p.segs["de.buf"].buf
            for o in ops:
                assert de[o.remote_offset : o.remote_offset + o.length] == src[o.local_offset : o.local_offset + o.length]
            p.segs["pe.kv"].buf[:] = bytes(SIZE)
            await peer.read(ops, cls, grant=p.g)
            kv = p.segs["pe.kv"].buf
            for o in ops:
                assert kv[o.local_offset : o.local_offset + o.length] == src[o.local_offset : o.local_offset + o.length]

    go(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_few_large_ops_cross_chunk_boundaries(backend):
    async def main() -> None:
        async with pair(backend) as p:
            p.fill("pe.kv")
            remote = p.fill("de.buf")
            peer = await p.pe.connect(p.de.desc())
            await peer.write([Op("kv", 0, "buf", 1, 3_000_001), Op("kv", 3_000_001, "buf", 3_000_002, 1_000_000)], B,
                             grant=p.g)
            assert p.segs["de.buf"].buf[1:4_000_002] == p.segs["pe.kv"].buf[0:4_000_001]
            assert p.segs["de.buf"].buf[0] == remote[0]
            await peer.read([Op("buf", 0, "buf", 0, SIZE)], L, grant=p.g)
            assert p.segs["pe.buf"].buf == p.segs["de.buf"].buf

    go(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_copy_local_moves_bytes_between_own_regions(backend):
    async def main() -> None:
        async with pair(backend) as p:
            src = p.fill("pe.buf")
            await p.pe.copy_local([Op("buf", 0, "kv", 100, 1 << 20), Op("buf", 5, "kv", 0, 7)], L)
            kv = p.segs["pe.kv"].buf
            assert kv[100 : 100 + (1 << 20)] == src[0 : 1 << 20] and kv[0:7] == src[5:12]

    go(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_regions_and_bounds_raise_typed_errors(backend):
    async def main() -> None:
        async with pair(backend) as p:
            peer = await p.pe.connect(p.de.desc())
            with pytest.raises(NotGranted) as ng:  # the grant is for "buf"
                await peer.write([Op("kv", 0, "nope", 0, 1)], L, grant=p.g)
            assert ng.value.region == "nope"
            with pytest.raises(RegionNotFound) as e:
                await peer.read([Op("nope", 0, "buf", 0, 1)], L, grant=p.g)
            assert e.value.name == "nope"
            with pytest.raises(NotGranted) as ng:
                await peer.write([Op("kv", 0, "buf", SIZE - 1, 2)], B, grant=p.g)
            assert (ng.value.region, ng.value.offset, ng.value.length) == ("buf", SIZE - 1, 2)
            with pytest.raises(OutOfBounds):
                await peer.read([Op("kv", SIZE, "buf", 0, 1)], L, grant=p.g)
            with pytest.raises(OutOfBounds):
                await p.pe.copy_local([Op("kv", 0, "buf", -1, 1)], L)
            with pytest.raises(RegionNotFound):
                p.de.grant("nope")
            await peer.write([Op("kv", 0, "buf", 0, 16)], L, grant=p.g)  # the link still works

    go(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("cls", [L, B])
def test_a_transfer_reaches_only_what_its_grant_covers(backend, cls):
    async def main() -> None:
        async with pair(backend) as p:
            src = p.fill("pe.kv")
            before = bytes(p.segs["de.buf"].buf)
            peer = await p.pe.connect(p.de.desc())
            g = p.de.grant("buf", [(8192, 4096), (4096, 4096), (65536, 100)], read=False)
            assert (g.starts, g.ends) == ([4096, 65536], [12288, 65636])  # touching ranges merge
            await peer.write([Op("kv", 0, "buf", 4096, 8192), Op("kv", 0, "buf", 65536, 100)], cls, grant=g)
            for bad in ([Op("kv", 0, "buf", 4095, 2)], [Op("kv", 0, "buf", 12000, 300)], [Op("kv", 0, "buf", 0, 1)]):
                with pytest.raises(NotGranted):
                    await peer.write(bad, cls, grant=g)
            with pytest.raises(NotGranted, match="read"):  # a write-only grant
                await peer.read([Op("kv", 0, "buf", 4096, 16)], cls, grant=g)
            with pytest.raises(NotGranted, match="no grant"):
                await peer.write([Op("kv", 0, "buf", 4096, 16)], cls)
            after = p.segs["de.buf"].buf
            assert after[4096:12288] == src[0:8192] and after[65536:65636] == src[0:100]
            assert after[:4096] == before[:4096] and after[12288:65536] == before[12288:65536]
            assert after[65636:] == before[65636:]

    go(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_regions_registered_after_connect_are_reachable_after_refresh(backend):
    async def main() -> None:
        async with pair(backend) as p:
            peer = await p.pe.connect(p.de.desc())
            late = ShmRegion.create(new_name("late"), 4096)
            try:
                with pytest.raises(RegionNotFound):
                    p.de.grant("late")
                p.de.register("late", late.buf, shm_name=late.name)
                g = p.de.grant("late")
                peer.refresh(p.de.desc())
                p.segs["pe.kv"].buf[:8] = b"12345678"
                await peer.write([Op("kv", 0, "late", 0, 8)], L, grant=g)
                assert bytes(late.buf[:8]) == b"12345678"
                await peer.close()
            finally:
                late.close()
                late.unlink()

    go(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_concurrent_transfers_in_both_classes(backend):
    async def main() -> None:
        async with pair(backend) as p:
            src = p.fill("pe.kv")
            peer = await p.pe.connect(p.de.desc())
            part = SIZE // 8
            jobs = [
                peer.write([Op("kv", i * part, "buf", i * part, part)], L if i % 2 else B, grant=p.g) for i in range(8)
            ]
            await asyncio.gather(*jobs)
            assert p.segs["de.buf"].buf == src
            p.segs["pe.kv"].buf[:] = bytes(SIZE)
            await asyncio.gather(*[peer.read(small_ops(64, 1000, 2048)[i::4], (L, B)[i % 2], grant=p.g) for i in range(4)])

    go(backend, main)


@pytest.mark.parametrize("backend", BACKENDS)
def test_peer_gone_fails_fast_not_hang(backend):
    async def main() -> None:
        async with pair(backend) as p:
            peer = await p.pe.connect(p.de.desc())
            await peer.write([Op("kv", 0, "buf", 0, 64)], L, grant=p.g)
            await p.de.close()  # whether the PE side has seen it yet or not, nothing hangs
            with pytest.raises((PeerGone, TransferTimeout)):
                await peer.write([Op("kv", 0, "buf", 0, 1 << 20)], B, timeout=2.0, grant=p.g)
            with pytest.raises((PeerGone, TransferTimeout)):
                await peer.read([Op("kv", 0, "buf", 0, 64)], L, timeout=2.0, grant=p.g)

    go(backend, main)


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
            await peer.write([Op("kv", 0, "buf", 0, SIZE)], B, grant=p.g)
            assert p.segs["de.buf"].buf == src

    asyncio.run(main())


def test_unknown_backend_is_a_clear_error():
    with pytest.raises(ValueError, match="unknown transport backend"):
        create_endpoint("carrier-pigeon")
