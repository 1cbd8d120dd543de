"""A fetch whose every hit was prefetched into the request's own DE's buffer (adopted there as the
prompt's first DE-buffer slots) moves every layer in one one-sided read before it reports:
`ReadFinished(layers=n)` naming those slots as DE hits, no `LayersLoaded` after it, so the
engine computes without waiting on a layer and never pushes those blocks back."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from services.traffic_manager.fetch import FetchPath
from services.traffic_manager.parts import TMParts
from services.traffic_manager.progress import LayerState, ReadTrack, Registry
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.slot_grants import GrantsHeld
from shared.bus import Losses
from shared.messages.registry import KVRegion
from shared.messages.storage_gateway import StoreLayout
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import FetchFailed, FetchKV, LayersLoaded, ReadFinished, Reserve, Reserved
from tests.unit.tm_util import buffer_pool

pytestmark = pytest.mark.unit
LAYERS, LB = 4, 1024
LAYOUT = StoreLayout(b"f" * 16, "m", LAYERS, 1, 8, "float32", 16)
DE_SLOTS = [7 * LAYERS * LB, 9 * LAYERS * LB, 3 * LAYERS * LB]  # the prompt's DE-buffer slots (3 blocks)


class Bus:
    """The DE's traffic-manager: adopts the two prefetched blocks as the prompt's first slots."""

    def __init__(self):
        self.losses = Losses()  # the real bus's: engines keep a request's connection
        self.heard, self.asked = [], []

    async def request(self, subject, msg, timeout, abort=None):
        self.asked.append(msg)
        assert isinstance(msg, Reserve), msg
        return Reserved(slots=DE_SLOTS, adopted=len(msg.adopt_block_keys))

    async def publish(self, subject, msg, ctx=None):
        self.heard.append(msg)


class Peer:
    def __init__(self):
        self.reads = []

    async def read(self, ops, cls, *, timeout=None, grant=None):
        self.reads.append(list(ops))


@pytest.fixture
def parts():
    region, pool, m = buffer_pool("t-fp", 16 * LAYERS * LB, KVRegion("kv", 16, 16, LAYERS, LAYERS * LB, LB))
    bus, peer = Bus(), Peer()

    async def reach(engine):
        assert engine == "de-1"
        return peer
    cfg = SimpleNamespace(transfer_timeout_s=2.0, engine="pe-1", read_layer_groups=8)
    yield TMParts(cfg, bus, Subjects("t"), m, pool, None, reach, ReadQueues(2.0),
                  m.counter("bytes_total", "b", ("kind",)), lambda coro, name=None: asyncio.ensure_future(coro),
                  None, GrantsHeld(), Registry(ReadTrack), Registry(LayerState)), bus, peer
    region.close()
    region.unlink()


def test_every_layer_of_adopted_prefetched_blocks_comes_in_one_read_before_the_report(parts):
    p, bus, peer = parts
    keys = [bytes([i]) * 16 for i in range(2)]
    msg = FetchKV("r#0", keys, [5, 2], "n0", LAYOUT, pe_blocks=0, de_engine="de-1", de_node="n1",
                  prompt_blocks=3, staged_engine="de-1", staged_owner="pf-1", staged_blocks=2)
    asyncio.run(asyncio.wait_for(FetchPath(p).fetch(msg, SimpleNamespace(ctx=None)), 10))
    assert bus.asked[0].adopt == "pf-1"
    heard = [m for m in bus.heard if isinstance(m, (ReadFinished, LayersLoaded, FetchFailed))]
    assert len(heard) == 1, heard  # no LayersLoaded: nothing for the forward to wait on
    done = heard[0]
    assert isinstance(done, ReadFinished) and (done.blocks, done.layers) == (2, LAYERS)
    assert (done.staged, done.de_read) == (2, 0)  # from a buffer, not read: the engine's `buffer` tier
    assert done.de_hits == [0, 1] and done.de_slots == DE_SLOTS  # adopted: never pushed back
    assert len(peer.reads) == 1 and len(peer.reads[0]) == 2 * LAYERS  # one read: every layer of both blocks
    bn = LAYERS * LB
    got = {(op.remote_offset, op.local_offset) for op in peer.reads[0]}
    assert got == {(DE_SLOTS[i] + layer * LB, blk * bn + layer * LB) for i, blk in enumerate([5, 2])
                   for layer in range(LAYERS)}
