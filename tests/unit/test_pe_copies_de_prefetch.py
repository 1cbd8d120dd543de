"""A prefetch staged on the decode side, in a traffic-manager buffer on the prefill engine's host,
costs the next turn no round trip: the scheduler names its slots in the assignment when the two
TMs share memory (`shm_host`), the prefill engine copies the blocks itself (no FetchKV, no
`Reserve(adopt)` before the forward, no `ReadFinished`), and the push's reservation at the
request's DE adopts them as the prompt's first DE-buffer slots, so they are not sent again.
Without shared memory (a tcp-only endpoint, another host) the assignment names no slots: the
FetchKV path claims or adopts them as before. Pure asyncio with recording stand-ins."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import numpy as np
import pytest

from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.handoff import Handoff
from services.prefill_engine.link import PeLink
from services.prefill_engine.record import PrefillRequest
from services.prefill_engine.staged_copy import StagedCopier
from services.scheduler.inflight import InFlight
from services.scheduler.placement import place
from services.scheduler.view import MeshView
from services.traffic_manager.parts import TMParts
from services.traffic_manager.prefetch import Entry, PrefetchPath
from services.traffic_manager.progress import LayerState, ReadTrack, Registry
from services.traffic_manager.push import PushPath
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.slot_grants import GrantsGiven, GrantsHeld
from services.traffic_manager.transfers import Transfers
from shared.bus import Losses
from shared.kv.allocator import SlotAllocator
from shared.kv.staged_table import StagedTable
from shared.messages.codes import LoadMode
from shared.messages.endpoints import EP
from shared.messages.registry import EngineAnnounce, KVRegion, TrafficManagerAnnounce
from shared.messages.storage_gateway import StoreLayout
from shared.messages.stream import PromptTiers
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import FetchKV, PushDone, PushKV, Release, Reserve, Reserved
from shared.messages.plan import KvPlan, KvRange, Source
from shared.messages.work import PrefillWork, Sampling, StagedSlots
from shared.metrics import Metrics
from shared.sched.prefetch import StagedSession
from shared.sched.reads import PendingReads
from shared.transport.base import shm_host
from shared.transport.shm_region import ShmRegion, new_name
from tests.unit.pe_util import bare_prefill, intake
from tests.unit.test_tm_fetch_adopt_gone import Endpoint
from tests.unit.tm_util import Reply, buffer_pool

pytestmark = pytest.mark.unit
BS, LAYERS, LB = 16, 4, 256
BLOCK = LAYERS * LB
LAYOUT = StoreLayout(bytes(16), "m", LAYERS, 1, 8, "float32", BS)
KEYS = [bytes([i]) * 16 for i in range(8)]
HITS = 3  # staged blocks; the prompt is 5 blocks


# --- the scheduler: which assignments name the staged slots --------------------------------------

def _view(pe_shm: str, de_shm: str) -> MeshView:
    v = MeshView(timeout_s=float("inf"))
    for eng, node, role, shm in (("pe0", "nA", "prefill", pe_shm), ("de0", "nB", "decode", de_shm)):
        v.update(EngineAnnounce(f"i-{eng}", node, engine=eng, role=role, kv=KVRegion("kv", 64, BS, LAYERS, BLOCK, LB),
                                total_blocks=64, store=LAYOUT), 0.0)
        v.update(TrafficManagerAnnounce(f"t-{eng}", node, engine=eng, ready=True, shm_host=shm), 0.0)
    return v


def _placed(view: MeshView, holder: str, pending: bool = False) -> PrefillWork:
    slots = StagedSlots("buf", "tab", 0, 7, [0, BLOCK, 2 * BLOCK])
    rec = InFlight("r1", list(range(5 * BS + 1)), Sampling(), hit_blocks=HITS, block_keys=KEYS[:5],
                   mode=LoadMode.DUALPATH, staged=StagedSession("pf-1", holder, "nB", KEYS[:HITS], 1e9, slots=slots,
                                                         pending=pending))
    return place(rec, "pe0", "de0", view, PendingReads(), "out.s1").work


@pytest.mark.parametrize(("pe_shm", "de_shm", "holder", "pending", "named"), [
    ("h1", "h1", "de0", False, True),  # decode side, same host, shared memory: the PE copies it
    ("h1", "h2", "de0", False, False),  # another host: claimed / adopted by the TMs
    ("", "", "de0", False, False),  # tcp-only endpoints: the wire, never a mapping
    ("h1", "h1", "de0", True, False),  # a kept turn's saved blocks (pending.py): claimed as before
    ("", "", "pe0", False, True),  # its own TM's buffer: always
])
def test_the_assignment_names_staged_slots_the_prefill_engine_can_map(pe_shm, de_shm, holder, pending, named):
    work = _placed(_view(pe_shm, de_shm), holder, pending)
    (buf,) = [r for r in work.plan.ranges if r.source == Source.BUFFER]
    assert (buf.start, buf.end, buf.engine, buf.owner) == (0, HITS, holder, "pf-1")
    assert (buf.slots is not None) == named


def test_a_tm_offers_its_memory_only_when_its_endpoint_serves_same_host_peers_by_shm():
    assert shm_host(SimpleNamespace(backend="shm", host_id="h")) == "h"
    assert shm_host(SimpleNamespace(backend="tcp", host_id="h", shm_fast_path=True)) == "h"  # "auto"
    assert shm_host(SimpleNamespace(backend="tcp", host_id="h", shm_fast_path=False)) == ""  # tcp outright


# --- the prefill engine: the copy, and who takes the slots back -----------------------------------

class Bus:
    def __init__(self):
        self.losses = Losses()  # the real bus's: engines keep a request's connection
        self.sent: list[tuple[str, object]] = []

    async def publish(self, subject, msg, ctx=None):
        self.sent.append((subject, msg))


class KV:
    block_size = BS

    def __init__(self, region: ShmRegion):
        self.region, self.alloc = region, SlotAllocator(16)

    def blocks_for(self, n_tokens: int) -> int:
        return -(-n_tokens // BS)

    def layout(self):
        return SimpleNamespace(block_nbytes=BLOCK)


@pytest.fixture
def host():
    """A holder TM's buffer (8 slots) with its stamp table, and a prefill engine's KV memory (16 blocks)."""
    buf, kv = ShmRegion.create(new_name("t-pcd"), 8 * BLOCK), ShmRegion.create(new_name("t-pck"), 16 * BLOCK)
    table = StagedTable.create(records=4)
    np.frombuffer(buf.buf, np.uint8)[:] = np.arange(8 * BLOCK) % 251
    yield SimpleNamespace(buf=buf, kv=kv, table=table)
    table.close()
    for r in (buf, kv):
        r.close()
        r.unlink()


async def _start(host, holder: str, revoke: bool = False):
    """One 5-block turn whose 3 hits sit in `holder`'s buffer (slots 5, 6, 2); the request's DE is de0."""
    record, stamp = host.table.publish()
    if revoke:
        host.table.revoke(record)
    slots = [5 * BLOCK, 6 * BLOCK, 2 * BLOCK]
    work = PrefillWork("r1", list(range(5 * BS + 1)), Sampling(), "de0", "out", block_keys=KEYS[:5], plan=KvPlan(
        [KvRange(0, HITS, Source.BUFFER, engine=holder, owner="pf-1",
                 slots=StagedSlots(host.buf.name, host.table.name, record, stamp, slots))], stored=HITS))
    bus, kv = Bus(), KV(host.kv)
    cfg = PrefillEngineConfig(block_size=BS, handoff_timeout_s=600, engine="pe0", namespace="t")
    svc = bare_prefill(bus, kv, LAYOUT, cfg, spawn=lambda coro, name=None, **_: asyncio.ensure_future(coro))
    req = await intake(svc, work)
    for _ in range(10):  # the spawned publishes run
        await asyncio.sleep(0)
    svc.fetcher.copier.close()
    ready = list(svc.queue)
    return req, bus, ready, slots


def test_a_decode_side_prefetch_is_copied_by_the_engine_and_left_for_the_push_to_adopt(host):
    req, bus, ready, slots = asyncio.run(_start(host, "de0"))
    assert ready == [req] and req.hit_tokens == HITS * BS and req.load.layers == LAYERS  # no layer to wait for
    assert not any(isinstance(m, FetchKV) for _, m in bus.sent), "a FetchKV although the engine copied them"
    assert not any(isinstance(m, Release) for _, m in bus.sent), "released: the push could not adopt them"
    assert (req.adopt, req.adopt_blocks) == ("pf-1", HITS)
    assert req.prompt_tiers(BS) == PromptTiers(computed=2 * BS + 1, buffer=HITS * BS)  # copied, not read
    for b, off in zip(req.blocks[:HITS], slots):
        assert bytes(host.kv.buf[b * BLOCK:(b + 1) * BLOCK]) == bytes(host.buf.buf[off:off + BLOCK])


@pytest.mark.parametrize("holder", ["pe0", "de1"])  # its own TM's buffer; another DE's on this host
def test_a_prefetch_copied_from_any_other_buffer_is_released_to_its_holder_as_used(host, holder):
    req, bus, ready, _ = asyncio.run(_start(host, holder))
    assert ready == [req] and req.adopt == ""
    assert [(s, m) for s, m in bus.sent if isinstance(m, Release)] == [
        (EP.TM_RELEASE.at("t", engine=holder), Release("pf-1", used=HITS))]


def test_a_copy_whose_stamp_went_fetches_the_usual_way(host):
    req, bus, ready, _ = asyncio.run(_start(host, "de0", revoke=True))
    fetches = [m for _, m in bus.sent if isinstance(m, FetchKV)]
    assert len(fetches) == 1 and fetches[0].staged_owner == "pf-1" and req.adopt == "" and ready == []


# --- the push: the reservation adopts what the engine copied, and sends only the rest ---------------

def test_the_push_reservation_adopts_the_copied_prefetch_and_sends_only_the_rest(host):
    kv = KVRegion("kv", 16, BS, LAYERS, BLOCK, LB)
    region, pool, m = buffer_pool("t-pcp", 16 * BLOCK, kv)
    de_region, de_pool, dm = buffer_pool("t-pcq", 16 * BLOCK, kv)
    try:
        de = PrefetchPath(SimpleNamespace(cfg=SimpleNamespace(transfer_timeout_s=5.0), pool=de_pool, metrics=dm,
                                          m_bytes=dm.counter("bytes_total", "b", ("kind",)), xfers=Transfers()), 4, 1.0)
        staged = [s * BLOCK for s in de_pool.slots.allocate("pf-1", HITS)]
        de.put(Entry("pf-1", 1e18, KEYS[:HITS], staged))
        given = GrantsGiven(Endpoint())

        class Mesh:  # the DE's traffic-manager answering Reserve as the service does
            reserves: list[Reserve] = []

            async def request(self, subject, msg, timeout, abort=None):
                self.reserves.append(msg)
                adopted = de.adopt(msg.adopt, msg.adopt_block_keys, msg.req_id) if msg.adopt else []
                offsets = adopted + [s * BLOCK for s in await de_pool.allocate_wait(msg.req_id, msg.n_blocks - len(adopted))]
                return Reserved(slots=offsets, adopted=len(adopted), grant=given.give(msg.req_id, offsets, BLOCK))

        writes = []

        class Peer:
            async def write(self, ops, cls, *, timeout=None, grant=None):
                writes.extend(ops)

        async def reach(engine):
            return Peer()
        mesh = Mesh()
        parts = TMParts(SimpleNamespace(transfer_timeout_s=2.0, engine="pe0", read_layer_groups=1, transport="shm"),
                        mesh, Subjects("t"), m, pool, Endpoint(), reach, ReadQueues(2.0),
                        m.counter("bytes_total", "b", ("kind",)), lambda coro, name=None: asyncio.ensure_future(coro),
                        None, GrantsHeld(), Registry(ReadTrack), Registry(LayerState))
        reply = Reply()
        reply.ctx = None
        push = PushKV("r1", [9, 3, 4, 7, 8], "de0", 5 * BS, adopt="pf-1", adopt_block_keys=KEYS[:HITS])
        asyncio.run(PushPath(parts, m.histogram("xfer_seconds", "x", ("kind",))).push(push, reply, None))
        assert isinstance(reply.msg, PushDone) and reply.msg.ok, reply.msg
        assert mesh.reserves[0].adopt == "pf-1" and reply.msg.slots[:HITS] == staged  # adopted: the first slots
        assert sorted({op.remote_offset - op.remote_offset % BLOCK for op in writes}) == sorted(reply.msg.slots[HITS:])
        assert "pf-1" not in de.entries and len(de_pool.slots.held("r1")) == 5
        assert parts.m_bytes.labels("prefetch_used")._value.get() == HITS * BLOCK
    finally:
        for r in (region, de_region):
            r.close()
            r.unlink()


def test_the_hand_off_asks_the_push_to_adopt_only_when_no_de_slots_were_reserved():
    sent = []

    class HBus:
        async def request(self, subject, msg, timeout=5.0, ctx=None, abort=None):
            sent.append(msg)
            return PushDone(ok=False, error="stop here")

    async def run(de_slots):
        h = Handoff(PeLink(HBus(), Subjects("t"), "pe0", lambda coro, name=None: asyncio.ensure_future(coro)),
                    PrefillEngineConfig(handoff_timeout_s=5.0, node="nA"), LAYOUT, ())
        work = PrefillWork("r1", list(range(5 * BS + 1)), Sampling(), "de0", "out", block_keys=KEYS[:5])
        req = PrefillRequest("r1", work.prompt, work.sampling, "out", None, work=work, blocks=[9, 3, 4, 7, 8, 1],
                             adopt="pf-1", adopt_blocks=HITS, de_slots=de_slots)
        h.start_push(req)
        await req.push
    asyncio.run(run([]))
    asyncio.run(run([0, BLOCK, 2 * BLOCK, 3 * BLOCK, 4 * BLOCK, 5 * BLOCK]))
    assert (sent[0].adopt, sent[0].adopt_block_keys) == ("pf-1", KEYS[:HITS])
    assert (sent[1].adopt, sent[1].adopt_block_keys) == ("", [])


def test_the_engine_maps_each_holders_buffer_once_and_closes_one_whose_segment_went(host):
    other, other_table = ShmRegion.create(new_name("t-pco"), 8 * BLOCK), StagedTable.create(records=4)
    copier = StagedCopier(KV(host.kv))
    try:
        for buf, table in ((host.buf, host.table), (other, other_table), (host.buf, host.table)):
            record, stamp = table.publish()
            assert copier.copy(StagedSlots(buf.name, table.name, record, stamp, [BLOCK]), [1])
        first = copier.buffers[host.buf.name]
        assert set(copier.buffers) == {host.buf.name, other.name}  # alternating holders: no remapping
        other.unlink()  # that traffic-manager restarted: its segments are gone
        other_table.region.unlink()
        fresh, fresh_table = ShmRegion.create(new_name("t-pcn"), 8 * BLOCK), StagedTable.create(records=4)
        record, stamp = fresh_table.publish()
        assert copier.copy(StagedSlots(fresh.name, fresh_table.name, record, stamp, [0]), [2])
        assert set(copier.buffers) == {host.buf.name, fresh.name} and copier.buffers[host.buf.name] is first
        assert set(copier.tables) == {host.table.name, fresh_table.name}
        copier.close()
        for r in (fresh, fresh_table.region):
            r.close()
            r.unlink()
    finally:
        copier.close()
        other_table.close()
        other.close()
