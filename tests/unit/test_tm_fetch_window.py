"""A fetch whose stored hits live in a hit window (two of four layers at a time) announces what is
in KV memory before it waits for the push that frees a window slot: the forward computes those
layers only once it hears of them, and only then can the push go on. (Announcements are
coalesced within `LAYER_NOTIFY_GAP_S`; a fetch that kept them back while it waited would wait
for ever: the forward waits for the announcement, the push for the forward.)"""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from services.traffic_manager import fetch as fetch_mod
from services.traffic_manager.fetch import FetchPath
from services.traffic_manager.parts import TMParts
from services.traffic_manager.progress import LayerState, ReadTrack, Registry
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.slot_grants import GrantsHeld
from shared.kv.window import NO_BLOCK
from shared.messages.registry import KVRegion
from shared.messages.storage_gateway import ReadDone, StoreLayout
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import FetchFailed, FetchKV, KVWindow, LayersLoaded, ReadFinished
from tests.unit.tm_util import buffer_pool

pytestmark = pytest.mark.unit
LAYERS, LB = 4, 1024
LAYOUT = StoreLayout(b"f" * 16, "m", LAYERS, 1, 8, "float32", 16)


class Mesh:
    """The bus (a gateway that reads every block at once; the engine, which computes a layer as soon
    as it hears it is loaded, and the push, which sends it on at once) and a copying endpoint."""

    def __init__(self, layers: Registry):
        self.layers, self.heard = layers, []

    async def request(self, subject, msg, timeout, abort=None):
        return ReadDone(blocks=len(msg.block_keys))

    async def publish(self, subject, msg, ctx=None):
        self.heard.append(msg)
        if isinstance(msg, LayersLoaded):  # computed and pushed on: the window's slots are free again
            state = self.layers.get(msg.req_id)
            state.computed = state.pushed = msg.layer + 1
            state.note()

    async def copy_local(self, ops, cls, *, timeout=None):
        return None


@pytest.fixture
def parts():
    region, pool, m = buffer_pool("t-fw", 16 * LAYERS * LB, KVRegion("kv", 16, 16, LAYERS, LAYERS * LB, LB))
    layers = Registry(LayerState)
    mesh = Mesh(layers)
    cfg = SimpleNamespace(transfer_timeout_s=2.0, engine="pe-1", read_layer_groups=8)
    yield TMParts(cfg, mesh, Subjects("t"), m, pool, mesh, None, ReadQueues(2.0),
                  m.counter("bytes_total", "b", ("kind",)), lambda coro, name=None: asyncio.ensure_future(coro),
                  None, GrantsHeld(), Registry(ReadTrack), layers)
    region.close()
    region.unlink()


def test_a_windowed_fetch_tells_the_engine_before_it_waits_for_a_push(parts, monkeypatch):
    monkeypatch.setattr(fetch_mod, "LAYER_NOTIFY_GAP_S", 60.0)  # copies this fast are never announced alone
    keys = [bytes([i]) * 16 for i in range(2)]
    msg = FetchKV("r#0", keys, [NO_BLOCK, NO_BLOCK], "n0", LAYOUT, pe_blocks=2,
                  window=KVWindow(2, [5], 2))  # 2 hits x 2 layers: one ring block

    async def run():
        await asyncio.wait_for(FetchPath(parts).fetch(msg, SimpleNamespace(ctx=None)), 10)
    asyncio.run(run())
    heard = [m for m in parts.bus.heard if isinstance(m, (ReadFinished, LayersLoaded, FetchFailed))]
    assert not [m for m in heard if isinstance(m, FetchFailed)], heard
    assert isinstance(heard[0], ReadFinished) and heard[0].blocks == 2
    loaded = [m.layer for m in heard if isinstance(m, LayersLoaded)]
    assert loaded[0] == 1 and loaded[-1] == LAYERS - 1  # layers 0-1 announced before layer 2 waited
