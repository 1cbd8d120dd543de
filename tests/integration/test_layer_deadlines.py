"""A layerwise push's deadline runs from the forward's last sign of life, not from its start.

A real nats-server, storage-gateway and two traffic-managers (the PE's, the DE's) run in this
process with a 1 s transfer deadline; the test plays the prefill engine. A forward on an
overloaded machine computes a layer every two deadlines and says it is alive in between
(`ForwardAlive`, as the engine does every quarter deadline): its push lands
whole. An engine that stops after layer 0 (it died) has its push failed, on the wire, once
a deadline has passed without a word from it.
"""
from __future__ import annotations

import asyncio
import contextlib

import pytest

from shared.messages.endpoints import EP
from shared.messages.traffic_manager import ForwardAlive, LayersComputed, PushKV
from shared.transport.shm_region import ShmRegion, new_name
from tests.integration.test_tm_failures import BLOCK_NBYTES, DE_ENGINE, ENGINE, NUM_BLOCKS, Mesh, NatsServer

pytestmark = pytest.mark.integration
DEADLINE = 1.0
LAYERS = 4


def _run(tmp_path, scenario) -> None:
    kv = ShmRegion.create(new_name("test-kv"), NUM_BLOCKS * BLOCK_NBYTES)
    de_kv = ShmRegion.create(new_name("test-de-kv"), NUM_BLOCKS * BLOCK_NBYTES)
    nats = NatsServer(tmp_path).start()

    async def main():
        mesh = Mesh(nats, tmp_path, (ENGINE, DE_ENGINE), timeout_s=DEADLINE)
        async with mesh:
            await mesh.attach(ENGINE, kv)
            await mesh.attach(DE_ENGINE, de_kv)
            while DE_ENGINE not in mesh.tm.remote:  # the PE's TM has heard of the DE's data plane
                await mesh.tm_beats[DE_ENGINE].get()
            await scenario(mesh, kv)
    try:
        asyncio.run(main())
    finally:
        nats.stop()
        for region in (kv, de_kv):
            with contextlib.suppress(BufferError):
                region.close()
            region.unlink()


async def _computed(mesh: Mesh, req_id: str, layer: int) -> None:
    await mesh.bus.publish(mesh.subjects.at(EP.TM_COMPUTED, engine=ENGINE), LayersComputed([req_id], layer))


async def _alive(mesh: Mesh, req_id: str) -> None:
    await mesh.bus.publish(mesh.subjects.at(EP.TM_ALIVE, engine=ENGINE), ForwardAlive([req_id]))


def test_a_slow_forward_that_keeps_saying_it_is_alive_is_pushed_whole(tmp_path):
    async def scenario(mesh: Mesh, kv: ShmRegion) -> None:
        kv.buf[:2 * BLOCK_NBYTES] = bytes(range(256)) * (2 * BLOCK_NBYTES // 256)
        push = asyncio.ensure_future(mesh.bus.request(
            mesh.subjects.at(EP.TM_PUSH, engine=ENGINE), PushKV("slow", [0, 1], DE_ENGINE, 8, layerwise=True),
            timeout=120))
        for layer in range(LAYERS):
            # the slow engine itself: each layer takes two deadlines, with a keep-alive every quarter one
            for _ in range(8):
                await asyncio.sleep(DEADLINE / 4)
                await _alive(mesh, "slow")
                assert not push.done(), push.result()
            await _computed(mesh, "slow", layer)
        done = await push
        assert (done.ok, done.error, done.nbytes) == (True, "", 2 * BLOCK_NBYTES)

    _run(tmp_path, scenario)


def test_an_engine_that_went_silent_has_its_push_failed_a_deadline_later(tmp_path):
    async def scenario(mesh: Mesh, kv: ShmRegion) -> None:
        push = asyncio.ensure_future(mesh.bus.request(
            mesh.subjects.at(EP.TM_PUSH, engine=ENGINE), PushKV("dead", [0, 1], DE_ENGINE, 8, layerwise=True),
            timeout=120))
        await _computed(mesh, "dead", 0)  # then nothing: the engine died
        done = await push
        assert not done.ok
        assert "layer 1 computed not within 1 s of the last progress" in done.error
        assert await mesh.tm_answers()

    _run(tmp_path, scenario)
