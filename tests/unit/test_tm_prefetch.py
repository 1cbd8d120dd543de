"""The traffic-manager's prefetched blocks: staged in spare slots a chunk at a time within the
budget, claimed by key prefix, given back on release, at their TTL, and the moment a real
reservation needs the room; and the gateway's bulk lane, which lets a prefetch read only while
no latency read is pending."""
from __future__ import annotations

import asyncio
import secrets
import time
from types import SimpleNamespace

import pytest

from services.storage_gateway.bulk import BulkLane
from services.traffic_manager.prefetch import PrefetchPath
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.slot_grants import GrantsGiven
from services.traffic_manager.transfers import Transfers
from shared.messages.registry import KVRegion
from shared.messages.storage_gateway import ReadDone, StoreLayout
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import Claim, Prefetch
from shared.metrics import Metrics
from shared.transport.grants import Grant, coalesce, decode_grant
from tests.unit.tm_util import Reply, buffer_pool

pytestmark = pytest.mark.unit
BLOCK = 4096
LAYOUT = StoreLayout(b"f" * 16, "m", 2, 1, 8, "float32", 16)


class Gateway:
    """A bus whose gateway reads succeed (optionally only up to `stored` keys), recording each read."""

    def __init__(self, stored: int = 1 << 30):
        self.stored, self.reads = stored, []

    async def request(self, subject, msg, timeout, abort=None):
        self.reads.append((len(msg.block_keys), msg.bulk, msg.start_within_s > 0))
        await asyncio.sleep(0)
        ok = max(0, min(len(msg.block_keys), self.stored - sum(n for n, *_ in self.reads[:-1])))
        return ReadDone(blocks=ok)


@pytest.fixture
def parts():
    region, pool, m = buffer_pool("t-pf", 16 * BLOCK, KVRegion("kv", 8, 16, 2, BLOCK, BLOCK // 2))
    yield SimpleNamespace(cfg=SimpleNamespace(transfer_timeout_s=5.0), bus=Gateway(), subjects=Subjects("t"),
                          metrics=m, pool=pool, queues=ReadQueues(5.0),
                          m_bytes=m.counter("bytes_total", "b", ("kind",)), xfers=Transfers())
    region.close()
    region.unlink()


def _keys(n, tag=b"k"):
    return [tag + bytes([i]) * 15 for i in range(n)]


def _stage(pf, owner, keys, ttl=30.0):
    reply = Reply()
    asyncio.run(pf.prefetch(Prefetch(owner, keys, "n0", LAYOUT, ttl), reply))
    return reply.msg


def test_staged_in_bulk_chunks_within_the_budget_then_claimed_by_prefix(parts):
    pf = PrefetchPath(parts, chunk_blocks=3, share=0.5)
    got = _stage(pf, "pf-a", _keys(12))
    assert got.blocks == 8 and not got.error  # half of 16 slots
    assert [n for n, *_ in parts.bus.reads] == [3, 3, 2] and all(b and w for _, b, w in parts.bus.reads)
    slots = pf.claim("pf-a", _keys(5) + _keys(1, b"x"))
    assert len(slots) == 5 and slots == pf.entries["pf-a"].slots[:5]
    assert pf.claim("nobody", _keys(3)) == []
    assert pf.room_bytes() == 0  # the budget is spent
    assert pf.drop("pf-a", "used") and parts.pool.slots.free == 16
    parts.pool.slots.check_integrity()


def test_a_miss_stops_the_stage_and_an_empty_one_holds_nothing(parts):
    parts.bus = Gateway(stored=4)
    pf = PrefetchPath(parts, chunk_blocks=3, share=1.0)
    assert _stage(pf, "pf-a", _keys(10)).blocks == 4
    assert len(parts.bus.reads) == 2  # the second chunk came back short: no third read
    parts.bus, parts.metrics = Gateway(stored=0), Metrics("traffic_manager")
    pf2 = PrefetchPath(parts, chunk_blocks=3, share=1.0)
    assert _stage(pf2, "pf-b", _keys(3)).blocks == 0 and "pf-b" not in pf2.entries
    assert len(parts.pool.slots.held("pf-b")) == 0


def test_a_real_reservation_takes_unclaimed_prefetched_slots_first(parts):
    pool = parts.pool
    pf = PrefetchPath(parts, chunk_blocks=8, share=1.0)
    pool.reclaim = pf.reclaim
    assert _stage(pf, "pf-late", _keys(6), ttl=60.0).blocks == 6
    assert _stage(pf, "pf-soon", _keys(6, b"s"), ttl=10.0).blocks == 6
    pf.claim("pf-soon", _keys(6, b"s"))  # being copied: never reclaimed
    pool.slots.allocate("other", 2)
    got = asyncio.run(pool.allocate_wait("req-1", 4))  # 2 spare: the prefetch due back last gives way
    assert len(got) == 4 and "pf-late" not in pf.entries and "pf-soon" in pf.entries
    with pytest.raises(Exception):  # claimed blocks stay: the wait ends at its deadline
        asyncio.run(pool.allocate_wait("req-2", 9))
    pool.slots.check_integrity()


def test_the_decode_side_adopts_staged_blocks_as_the_requests_own_slots(parts):
    pool = parts.pool
    pf = PrefetchPath(parts, chunk_blocks=8, share=1.0)
    assert _stage(pf, "pf-a", _keys(6)).blocks == 6
    staged = list(pf.entries["pf-a"].slots)
    got = pf.adopt("pf-a", _keys(4) + _keys(1, b"x"), "req-1")
    assert got == staged[:4] and "pf-a" not in pf.entries
    assert [s * BLOCK for s in pool.slots.held("req-1")] == got and not pool.slots.held("pf-a")
    assert pool.slots.free == 12
    pool.free("req-1")
    assert pool.slots.free == 16
    pool.slots.check_integrity()


class Endpoint:
    """Grants as a serving endpoint makes them, and which are live."""

    def __init__(self):
        self.live: dict[bytes, Grant] = {}

    def grant(self, region, ranges):
        g = Grant(secrets.token_bytes(16), region, *coalesce(ranges))
        self.live[g.token] = g
        return g

    def revoke(self, g):
        return self.live.pop(g.token, None) is not None


def test_another_tms_claim_gets_a_grant_of_exactly_the_claimed_slots_ended_when_they_go(parts):
    ep = Endpoint()
    parts.given = GrantsGiven(ep)
    parts.pool.on_free = parts.given.take_back
    pf = PrefetchPath(parts, chunk_blocks=8, share=1.0)
    assert _stage(pf, "pf-a", _keys(6)).blocks == 6
    staged = list(pf.entries["pf-a"].slots)
    reply = Reply()
    asyncio.run(pf.on_claim(Claim("pf-a", _keys(4) + _keys(1, b"x")), reply))
    assert reply.msg.slots == staged[:4]
    g = decode_grant(reply.msg.grant)
    assert g is not None and g.token in ep.live
    assert all(g.covers(off, BLOCK, False) for off in staged[:4])
    assert not any(g.covers(off, BLOCK, False) for off in staged[4:])  # staged, not claimed: out of reach
    reply = Reply()
    asyncio.run(pf.on_claim(Claim("pf-a", _keys(1, b"x")), reply))  # nothing matches: no slots, no grant
    assert reply.msg.slots == [] and reply.msg.grant == b""
    assert pf.drop("pf-a", "released") and not ep.live  # the slots went back: the grant ended with them


def test_unclaimed_blocks_go_at_their_ttl_claimed_ones_at_their_lease(parts):
    pf = PrefetchPath(parts, chunk_blocks=8, share=1.0)
    _stage(pf, "pf-a", _keys(2), ttl=1.0)
    _stage(pf, "pf-b", _keys(2, b"b"), ttl=1.0)
    pf.claim("pf-b", _keys(2, b"b"))
    pf.expire(time.monotonic() + 2.0)
    assert list(pf.entries) == ["pf-b"]
    pf.expire(time.monotonic() + 1e6)
    assert not pf.entries and parts.pool.slots.free == 16


def test_the_bulk_lane_waits_for_latency_reads_and_gives_up_past_its_limit():
    async def go():
        lane, order = BulkLane(), []

        async def bulk(tag, within=0.0):
            ok = await lane.wait_turn(within)
            order.append((tag, ok))

        assert await lane.wait_turn()  # no latency read: at once
        with lane.latency_read():
            task = asyncio.create_task(bulk("b1"))
            late = asyncio.create_task(bulk("b2", within=0.05))
            await late  # it gives up once its 0.05 s pass under a latency read
            assert order == [("b2", False)] and lane.waiting == 1
            order.append(("latency done", True))
        await task
        return order

    assert asyncio.run(go()) == [("b2", False), ("latency done", True), ("b1", True)]


def test_the_sweep_sleeps_while_nothing_is_staged_and_expires_what_is(parts, monkeypatch):
    """No polling of an empty table: with SWEEP_S at 0 a polling sweep would run at every loop turn."""
    monkeypatch.setattr("services.traffic_manager.prefetch.SWEEP_S", 0.0)
    pf = PrefetchPath(parts, chunk_blocks=8, share=1.0)
    sweeps = []
    expire = pf.expire
    pf.expire = lambda now: (sweeps.append(now), expire(now))

    async def run():
        task = asyncio.ensure_future(pf.sweep())
        for _ in range(50):
            await asyncio.sleep(0)
        idle = len(sweeps)
        await pf.prefetch(Prefetch("o1", _keys(2), "n0", LAYOUT, 0.0), Reply())  # a TTL of 0: due at once
        while "o1" in pf.entries:  # the sweep woke and dropped it
            await asyncio.sleep(0)
        task.cancel()
        return idle

    assert asyncio.run(run()) == 0
    assert sweeps
