"""A fetch whose prefetch sat in the request's own DE's buffer, but was gone (its TTL, a release,
buffer pressure) by the time the fetch's `Reserve` came to adopt it: the DE reserved the whole
prompt's slots all the same, and nothing reads into them. The engine must hear of those slots
(`ReadFinished.de_slots`), so its push writes into them instead of reserving the prompt a second
time: in a 16-slot DE buffer a 12-block prompt held 12 slots while the push waited, until its
deadline, for 12 more."""
from __future__ import annotations

import asyncio
import secrets
from types import SimpleNamespace

import pytest

from services.traffic_manager.fetch import FetchPath
from services.traffic_manager.parts import TMParts
from services.traffic_manager.progress import LayerState, ReadTrack, Registry
from services.traffic_manager.push import PushPath
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.slot_grants import GrantsGiven, GrantsHeld
from shared.kv.allocator import OutOfSlots
from shared.messages.codes import ErrorCode
from shared.messages.registry import KVRegion
from shared.messages.storage_gateway import ReadBlocks, ReadDone, StoreLayout
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import FetchKV, PushKV, ReadFinished, Reserve, Reserved
from shared.transport.grants import Grant, coalesce
from tests.unit.tm_util import Reply, buffer_pool

pytestmark = pytest.mark.unit
LAYERS, LB, SLOTS, PROMPT = 4, 1024, 16, 12
LAYOUT = StoreLayout(b"f" * 16, "m", LAYERS, 1, 8, "float32", 16)
KV = KVRegion("kv", 16, 16, LAYERS, LAYERS * LB, LB)


class Endpoint:
    """Grants as the DE's endpoint makes them; local copies that need no bytes."""

    def grant(self, region, ranges):
        return Grant(secrets.token_bytes(16), region, *coalesce(ranges))

    def revoke(self, g):
        pass

    async def copy_local(self, ops, cls, *, timeout=None):
        return None


class Mesh:
    """The bus: this node's gateway (reads every block), and the DE's traffic-manager over a real
    16-slot pool, answering `Reserve` as the service does when the prefetch to adopt is gone."""

    def __init__(self, de_pool):
        self.de_pool, self.given, self.heard, self.reserves = de_pool, GrantsGiven(Endpoint()), [], []

    async def request(self, subject, msg, timeout, abort=None):
        if isinstance(msg, ReadBlocks):
            return ReadDone(blocks=len(msg.block_keys))
        assert isinstance(msg, Reserve), msg
        self.reserves.append(msg)
        try:  # nothing staged under msg.adopt any more: nothing adopted
            slots = await self.de_pool.allocate_wait(msg.req_id, msg.n_blocks)
        except OutOfSlots as exc:
            self.de_pool.free(msg.req_id)
            return Reserved(ok=False, error=f"DE buffer full: {exc}", code=ErrorCode.BUFFER_FULL)
        bn = self.de_pool.block_nbytes
        offsets = [s * bn for s in slots]
        return Reserved(slots=offsets, grant=self.given.give(msg.req_id, offsets, bn))

    async def publish(self, subject, msg, ctx=None):
        self.heard.append(msg)


class Peer:
    def __init__(self):
        self.writes = []

    async def write(self, ops, cls, *, timeout=None, grant=None):
        self.writes.append((list(ops), grant))


@pytest.fixture
def parts():
    region, pool, m = buffer_pool("t-fa", SLOTS * LAYERS * LB, KV)
    de_region, de_pool, _ = buffer_pool("t-fad", SLOTS * LAYERS * LB, KV)
    mesh, peer = Mesh(de_pool), Peer()

    async def reach(engine):
        assert engine == "de-1"
        return peer
    cfg = SimpleNamespace(transfer_timeout_s=2.0, engine="pe-1", read_layer_groups=8, transport="shm")
    yield TMParts(cfg, mesh, Subjects("t"), m, pool, Endpoint(), reach, ReadQueues(2.0),
                  m.counter("bytes_total", "b", ("kind",)), lambda coro, name=None: asyncio.ensure_future(coro),
                  None, GrantsHeld(), Registry(ReadTrack), Registry(LayerState)), mesh, peer
    for r in (region, de_region):
        r.close()
        r.unlink()


def test_a_reserve_that_adopts_nothing_is_the_prompts_only_de_reservation(parts):
    p, mesh, peer = parts
    keys = [bytes([i]) * 16 for i in range(PROMPT)]
    # every hit was prefetched into the DE's buffer: all of them on the PE path, none on the DE path
    msg = FetchKV("r#0", keys, list(range(PROMPT)), "n0", LAYOUT, pe_blocks=PROMPT, de_engine="de-1", de_node="n1",
                  prompt_blocks=PROMPT, staged_engine="de-1", staged_owner="pf-1", staged_blocks=PROMPT)
    asyncio.run(asyncio.wait_for(FetchPath(p).fetch(msg, SimpleNamespace(ctx=None)), 10))
    assert mesh.reserves[0].adopt == "pf-1"
    done = [m for m in mesh.heard if isinstance(m, ReadFinished)]
    assert len(done) == 1 and done[0].blocks == PROMPT and done[0].de_hits == []
    held = [s * LAYERS * LB for s in mesh.de_pool.slots.held("r#0")]
    assert len(held) == PROMPT  # the prompt's DE-buffer slots, adopting nothing

    # the engine's push, as the hand-off builds it from what the read reported
    push = PushKV("r#0", list(range(PROMPT)), "de-1", PROMPT * 16, dst_slots=done[0].de_slots, skip=done[0].de_hits)
    reply = Reply()
    reply.ctx = None
    asyncio.run(asyncio.wait_for(PushPath(p, p.metrics.histogram("xfer_seconds", "x", ("kind",))).push(
        push, reply, None), 10))
    assert reply.msg.ok, reply.msg.error
    assert len(mesh.reserves) == 1 and sorted(done[0].de_slots) == sorted(held)  # told, never reserved twice
    assert len(mesh.de_pool.slots.held("r#0")) == PROMPT
    ops, grant = peer.writes[0]
    assert sorted(op.remote_offset for op in ops) == sorted(held) and grant is not None

