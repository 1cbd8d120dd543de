"""Every traffic-manager failure is answered on the wire, never by the engine's timeout.

A real nats-server, a real storage-gateway and traffic-manager run by the runtime in this
process; the test plays the engine (it owns the KV memory segment and announces it). The
transfer deadline is 600 s, past the test's own timeout: each failure below is seen only
because the traffic-manager says so.
"""
from __future__ import annotations

import asyncio
import contextlib
import uuid

import pytest

from services.storage_gateway.app import StorageGatewayService
from services.storage_gateway.config import StorageGatewayConfig
from services.traffic_manager.app import NOT_ATTACHED, TrafficManagerService
from services.traffic_manager.config import TrafficManagerConfig
from shared.bus import Bus, Delivery
from shared.messages.codes import ErrorCode
from shared.messages.endpoints import EP
from shared.messages.registry import Announce, EngineAnnounce, KVRegion, TrafficManagerAnnounce
from shared.messages.storage_gateway import HitQuery, StoreLayout
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import (FetchFailed, FetchKV, FetchProgress, LayersLoaded, LoadKV, ReadFinished,
                                             Release, Reserve, SaveKV)
from shared.runtime import run_service
from shared.transport.shm_region import ShmRegion, new_name
from tests.integration.natsutil import NatsServer

pytestmark = pytest.mark.integration

LAYOUT = StoreLayout(fingerprint=b"\xcd" * 16, model_id="tm-failures", n_layers=4, n_kv_heads=1, head_dim=8,
                     dtype="float32", block_size=4)
LAYER_NBYTES = 2 * 4 * 1 * 8 * 4  # (K, V) x block_size x heads x head_dim x float32
BLOCK_NBYTES = 4 * LAYER_NBYTES
NUM_BLOCKS = 4
NODE, ENGINE, DE_ENGINE = "n0", "e0", "e1"
HUGE = 600.0  # transfer deadline: no failure below may be learnt by waiting for it


class Mesh:
    """A gateway and traffic-managers (one per engine) in this event loop, and a bus for the test."""

    def __init__(self, nats: NatsServer, tmp_path, engines: tuple[str, ...] = (ENGINE,), timeout_s: float = HUGE):
        self.ns = "t" + uuid.uuid4().hex[:8]
        self.subjects = Subjects(self.ns)
        common = dict(nats_url=nats.url, namespace=self.ns, node=NODE, heartbeat_s=0.05)
        self.gateway = StorageGatewayService(StorageGatewayConfig(store=str(tmp_path / "store"), instance=f"sg-{self.ns}", **common))
        self.tms = {e: TrafficManagerService(TrafficManagerConfig(engine=e, buffer_mb=1, transfer_timeout_s=timeout_s,
                                                                  instance=f"tm-{e}-{self.ns}", **common))
                    for e in engines}
        self.tm = self.tms[ENGINE]
        self.url = nats.url
        self.stop = asyncio.Event()
        self.lives: list[asyncio.Future] = []
        self.loaded: asyncio.Queue[FetchProgress] = asyncio.Queue()
        self.tm_beats: dict[str, asyncio.Queue[TrafficManagerAnnounce]] = {e: asyncio.Queue() for e in engines}

    async def __aenter__(self) -> "Mesh":
        self.bus = await Bus.connect(self.url, "engine-under-test")
        await self.bus.subscribe(self.subjects.at(EP.PE_LOADED, engine=ENGINE), self._on_loaded)
        await self.bus.subscribe(self.subjects.at(EP.HEARTBEAT), self._on_beat)
        self.lives = [asyncio.ensure_future(run_service(s, self.stop)) for s in (self.gateway, *self.tms.values())]
        for beats in self.tm_beats.values():
            await beats.get()  # up and heartbeating
        return self

    async def __aexit__(self, *exc) -> None:
        self.stop.set()
        await asyncio.gather(*self.lives)
        await self.bus.close()

    async def _on_loaded(self, msg: FetchProgress, d: Delivery) -> None:
        self.loaded.put_nowait(msg)

    async def _on_beat(self, msg, d: Delivery) -> None:
        if isinstance(msg, TrafficManagerAnnounce) and msg.engine in self.tms \
                and msg.instance == self.tms[msg.engine].instance:
            self.tm_beats[msg.engine].put_nowait(msg)

    async def attach(self, engine: str, kv: ShmRegion) -> None:
        """Announce `kv` as `engine`'s KV memory (the test plays the engine); until its TM says ready."""
        region = KVRegion(kv.name, NUM_BLOCKS, LAYOUT.block_size, LAYOUT.n_layers, BLOCK_NBYTES, LAYER_NBYTES)
        await self.bus.publish(self.subjects.at(EP.HEARTBEAT), EngineAnnounce(
            instance=f"engine-{engine}", node=NODE, engine=engine, role="prefill", kv=region))
        while not (await self.tm_beats[engine].get()).ready:
            pass

    async def until_stored(self, keys: list[bytes]) -> None:
        """Until the gateway reports every key present (the TM's background writes landed)."""
        query = HitQuery(LAYOUT, keys)
        while (await self.bus.request(self.subjects.at(EP.SG_HIT), query)).blocks < len(keys):
            await asyncio.sleep(0.02)  # a poll of the condition, not a wait for time to pass

    async def store_two_blocks(self, kv: ShmRegion) -> list[bytes]:
        """Fill blocks 0 and 1 of `kv`, persist them through the TM's save path; their keys."""
        kv.buf[:2 * BLOCK_NBYTES] = bytes(range(256)) * (2 * BLOCK_NBYTES // 256)
        keys = [uuid.uuid4().bytes, uuid.uuid4().bytes]
        saved = await self.bus.request(self.subjects.at(EP.TM_SAVE, engine=ENGINE),
                                       SaveKV("s", [0, 1], keys, NODE, LAYOUT), timeout=60)
        assert (saved.copied, saved.error) == (2, "")
        await self.until_stored(keys)
        return keys

    async def tm_answers(self) -> bool:
        """The traffic-manager still serves: a reservation is granted and released."""
        res = await self.bus.request(self.subjects.at(EP.TM_RESERVE, engine=ENGINE), Reserve("probe", 1), timeout=60)
        await self.bus.publish(self.subjects.at(EP.TM_RELEASE, engine=ENGINE), Release("probe"))
        return res.ok


def run(tmp_path, scenario, engines: tuple[str, ...] = (ENGINE,)) -> None:
    nats = NatsServer(tmp_path).start()
    try:
        asyncio.run(scenario(Mesh(nats, tmp_path, engines)))
    finally:
        nats.stop()


def test_fetch_before_kv_memory_is_attached_is_answered_at_once(tmp_path):
    async def scenario(mesh: Mesh) -> None:
        async with mesh:
            fetch = FetchKV("early", [b"\xab" * 16], [0], NODE, LAYOUT, 1)
            await mesh.bus.publish(mesh.subjects.at(EP.TM_FETCH, engine=ENGINE), fetch)
            msg = await mesh.loaded.get()
            assert msg == FetchFailed("early", ErrorCode.NOT_READY, NOT_ATTACHED)
            load = await mesh.bus.request(mesh.subjects.at(EP.TM_LOAD, engine=ENGINE), LoadKV("early", [0], [0]),
                                          timeout=60)
            assert (load.ok, load.error, load.code) == (False, NOT_ATTACHED, ErrorCode.NOT_READY)
            assert not any(life.done() for life in mesh.lives)

    run(tmp_path, scenario)


def test_a_fetch_that_dies_mid_layers_tells_the_engine_which_layers_landed(tmp_path):
    """The KV segment ends inside the last block: layers 0 and 1 of block 3 fit, layer 2 does not.
    The copy of layer 2 fails; the engine hears it, with layers 0..1 in place, and the TM serves on."""
    kv = ShmRegion.create(new_name("test-kv"), (NUM_BLOCKS - 1) * BLOCK_NBYTES + 2 * LAYER_NBYTES)

    async def scenario(mesh: Mesh) -> None:
        async with mesh:
            await mesh.attach(ENGINE, kv)
            keys = await mesh.store_two_blocks(kv)

            await mesh.bus.publish(mesh.subjects.at(EP.TM_FETCH, engine=ENGINE),
                                   FetchKV("f", keys[:1], [3], NODE, LAYOUT, 1))
            read = await mesh.loaded.get()
            assert read == ReadFinished("f", 1)  # the read itself worked
            msgs = [await mesh.loaded.get()]
            while not isinstance(msgs[-1], FetchFailed):
                msgs.append(await mesh.loaded.get())
            failed = msgs[-1]
            assert (failed.req_id, failed.code, failed.layers) == ("f", ErrorCode.KV_TRANSFER, 2)
            assert failed.error.startswith("OutOfBounds: region 'kv'")
            assert all(isinstance(m, LayersLoaded) and m.layer <= 1 for m in msgs[:-1])  # none past the failure
            assert bytes(kv.buf[3 * BLOCK_NBYTES:3 * BLOCK_NBYTES + 2 * LAYER_NBYTES]) == bytes(
                kv.buf[:2 * LAYER_NBYTES])  # layers 0..1 really landed
            assert await mesh.tm_answers()
            assert not any(life.done() for life in mesh.lives)

    try:
        run(tmp_path, scenario)
    finally:
        with contextlib.suppress(BufferError):
            kv.close()
        kv.unlink()


def test_a_de_path_fetch_that_dies_mid_layers_is_answered_too(tmp_path):
    """Every hit on the DE path: the DE's traffic-manager stages the block in its buffer, the
    PE's reads it one-sidedly layer by layer into a KV segment that ends inside block 3."""
    kv = ShmRegion.create(new_name("test-kv"), (NUM_BLOCKS - 1) * BLOCK_NBYTES + 2 * LAYER_NBYTES)
    de_kv = ShmRegion.create(new_name("test-de-kv"), NUM_BLOCKS * BLOCK_NBYTES)

    async def scenario(mesh: Mesh) -> None:
        async with mesh:
            await mesh.attach(ENGINE, kv)
            await mesh.attach(DE_ENGINE, de_kv)
            keys = await mesh.store_two_blocks(kv)
            while DE_ENGINE not in mesh.tm.remote:  # the PE's TM has heard of the DE's data plane
                await mesh.tm_beats[DE_ENGINE].get()
            fetch = FetchKV("d", keys[:1], [3], NODE, LAYOUT, pe_blocks=0, de_engine=DE_ENGINE, de_node=NODE,
                            prompt_blocks=1)
            await mesh.bus.publish(mesh.subjects.at(EP.TM_FETCH, engine=ENGINE), fetch)
            read = await mesh.loaded.get()
            assert isinstance(read, ReadFinished) and (read.blocks, read.de_hits) == (1, [0])
            failed = await mesh.loaded.get()
            while not isinstance(failed, FetchFailed):
                failed = await mesh.loaded.get()
            assert (failed.req_id, failed.code, failed.layers) == ("d", ErrorCode.KV_TRANSFER, 2)
            assert failed.error.startswith("OutOfBounds")
            assert bytes(kv.buf[3 * BLOCK_NBYTES:3 * BLOCK_NBYTES + 2 * LAYER_NBYTES]) == bytes(
                kv.buf[:2 * LAYER_NBYTES])  # layers 0..1 came over from the DE buffer
            assert await mesh.tm_answers()

    try:
        run(tmp_path, scenario, engines=(ENGINE, DE_ENGINE))
    finally:
        for region in (kv, de_kv):
            with contextlib.suppress(BufferError):
                region.close()
            region.unlink()


def test_an_engine_restarted_with_new_kv_memory_is_attached_and_served(tmp_path):
    """An engine that restarts announces a new KV segment under the same engine id: its TM lets
    the old one go and serves the new one (a fetch lands there), with no handler failing on the way."""
    old = ShmRegion.create(new_name("test-kv"), NUM_BLOCKS * BLOCK_NBYTES)
    new = ShmRegion.create(new_name("test-kv2"), NUM_BLOCKS * BLOCK_NBYTES)

    async def scenario(mesh: Mesh) -> None:
        async with mesh:
            await mesh.attach(ENGINE, old)
            keys = await mesh.store_two_blocks(old)
            errors = mesh.tm.bus.handler_errors
            region = KVRegion(new.name, NUM_BLOCKS, LAYOUT.block_size, LAYOUT.n_layers, BLOCK_NBYTES, LAYER_NBYTES)
            await mesh.bus.publish(mesh.subjects.at(EP.HEARTBEAT), EngineAnnounce(
                instance="engine-restarted", node=NODE, engine=ENGINE, role="prefill", kv=region))
            while mesh.tm.pool.layout.shm_name != new.name and mesh.tm.bus.handler_errors == errors:
                await asyncio.sleep(0.01)  # a poll of the condition: attached, or the handler failed
            assert mesh.tm.bus.handler_errors == errors, "the announcement of the new KV memory failed"
            await mesh.bus.publish(mesh.subjects.at(EP.TM_FETCH, engine=ENGINE),
                                   FetchKV("again", keys[:1], [2], NODE, LAYOUT, 1))
            msgs = [await mesh.loaded.get()]
            while not (isinstance(msgs[-1], LayersLoaded) and msgs[-1].layer == LAYOUT.n_layers - 1):
                assert not isinstance(msgs[-1], FetchFailed), msgs[-1]
                msgs.append(await mesh.loaded.get())
            assert bytes(new.buf[2 * BLOCK_NBYTES:3 * BLOCK_NBYTES]) == bytes(old.buf[:BLOCK_NBYTES])
            assert await mesh.tm_answers()

    try:
        run(tmp_path, scenario)
    finally:
        for kv in (old, new):
            with contextlib.suppress(BufferError):
                kv.close()
            kv.unlink()
