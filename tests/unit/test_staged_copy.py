"""A prefetch copied by the prefill engine straight from its own traffic-manager's buffer: the TM
publishes a staged entry's slots with a stamp, the engine copies exactly those bytes and checks
the stamp afterwards; every way the entry's slots can go (used, release, TTL, buffer pressure,
adoption, an engine restart) revokes the stamp first, so a copy that overlapped it is refused;
a claimed entry is never published; `Release(used=n)` counts the bytes used and frees the slots."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import numpy as np
import pytest

from services.prefill_engine.staged_copy import StagedCopier, runs
from services.traffic_manager.pool import BufferPool
from services.traffic_manager.prefetch import PrefetchPath
from services.traffic_manager.read_queues import ReadQueues
from services.traffic_manager.transfers import Transfers
from shared.kv.staged_table import StagedTable
from shared.messages.registry import KVRegion
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import Prefetch, Release
from shared.messages.work import StagedSlots
from shared.metrics import Metrics
from shared.transport.shm_region import ShmRegion, new_name
from tests.unit.test_tm_prefetch import BLOCK, LAYOUT, Gateway, Reply, _keys

pytestmark = pytest.mark.unit
LAYER = BLOCK // 2


@pytest.fixture
def tm():
    """A TM's prefetch path over a 16-slot buffer with a stamp table, and an engine's 8-block KV memory."""
    buf, kv_region = ShmRegion.create(new_name("t-sc"), 16 * BLOCK), ShmRegion.create(new_name("t-kv"), 8 * BLOCK)
    m = Metrics("traffic_manager")
    pool = BufferPool(buf, wait_s=0.2, m_free=m.gauge("buffer_free_bytes", "free"))
    pool.attach(KVRegion(kv_region.name, 8, 16, 2, BLOCK, LAYER))
    parts = SimpleNamespace(cfg=SimpleNamespace(transfer_timeout_s=5.0), bus=Gateway(), subjects=Subjects("t"),
                            metrics=m, pool=pool, queues=ReadQueues(5.0), m_bytes=m.counter("bytes_total", "b", ("kind",)),
                            xfers=Transfers())
    table = StagedTable.create(records=8)
    pf = PrefetchPath(parts, chunk_blocks=8, share=1.0, table=table)
    pool.reclaim = pf.reclaim
    kv = SimpleNamespace(region=kv_region, layout=lambda: pool.layout)
    copier = StagedCopier(kv)
    yield SimpleNamespace(pf=pf, pool=pool, parts=parts, copier=copier, kv=kv_region, buf=buf, table=table)
    copier.close()
    table.close()
    for r in (buf, kv_region):
        r.close()
        r.unlink()


def _stage(t, owner, n, tag=b"k", ttl=30.0):
    """Stage n blocks, fill their slots with bytes naming (owner, block) as a gateway would; the reply."""
    reply = Reply()
    asyncio.run(t.pf.prefetch(Prefetch(owner, _keys(n, tag), "n0", LAYOUT, ttl), reply))
    mem = np.frombuffer(t.buf.buf, np.uint8)
    for i, off in enumerate(t.pf.entries[owner].slots):
        mem[off:off + BLOCK] = (hash((owner, i)) + np.arange(BLOCK)) % 251
    return reply.msg


def _kv_block(t, b):
    return bytes(t.kv.buf[b * BLOCK:(b + 1) * BLOCK])


def _slot(t, off):
    return bytes(t.buf.buf[off:off + BLOCK])


def test_the_engine_copies_exactly_the_published_slots_and_release_used_frees_them(tm):
    got = _stage(tm, "pf-a", 5)
    assert got.blocks == 5 and got.slots is not None and got.slots.slots == tm.pf.entries["pf-a"].slots
    assert got.slots.buffer == tm.buf.name and got.slots.table == tm.table.name
    dst = [7, 2, 3, 4]  # the engine's KV blocks for the first 4 hits
    assert tm.copier.copy(got.slots, dst)
    assert all(_kv_block(tm, b) == _slot(tm, off) for b, off in zip(dst, got.slots.slots))
    assert _kv_block(tm, 0) == bytes(BLOCK)  # nothing else written
    assert tm.pf.used(Release("pf-a", used=4))
    assert tm.parts.m_bytes.labels("prefetch_used")._value.get() == 4 * BLOCK
    assert "pf-a" not in tm.pf.entries and tm.pool.slots.free == 16
    assert not tm.copier.copy(got.slots, dst)  # used: the stamp went with it


@pytest.mark.parametrize("how", ["released", "ttl", "pressure", "adopted", "engine restart"])
def test_every_way_the_slots_go_revokes_the_stamp_first(tm, how):
    got = _stage(tm, "pf-a", 4, ttl=1.0)
    assert tm.table.valid(got.slots.record, got.slots.stamp)
    if how == "released":
        tm.pf.drop("pf-a", "released")
    elif how == "ttl":
        tm.pf.expire(time.monotonic() + 2.0)
    elif how == "pressure":
        asyncio.run(tm.pool.allocate_wait("req-1", 16))
    elif how == "adopted":
        tm.pf.adopt("pf-a", _keys(4), "req-1")
    else:
        tm.pf.reset()  # as the TM does when its engine announces new KV memory, before the buffer is cut anew
        tm.pool.attach(tm.pool.layout)
    assert not tm.table.valid(got.slots.record, got.slots.stamp)
    assert not tm.copier.copy(got.slots, [0, 1, 2, 3])


def test_a_drop_while_the_engine_copies_makes_it_refuse_the_copy(tm, monkeypatch):
    """The slots freed and reused mid-copy: the copied bytes are torn, and the stamp says so."""
    got = _stage(tm, "pf-a", 4)
    real = np.frombuffer

    def copy_then_drop(buf, dtype=None, **kw):  # the TM drops the entry between the copy's two views
        if buf is tm.kv.buf:
            tm.pf.reclaim(16)
            np.frombuffer(tm.buf.buf, np.uint8)[:] = 9  # another read writes into the freed slots
        return real(buf, dtype=dtype, **kw)

    monkeypatch.setattr("services.prefill_engine.staged_copy.np.frombuffer", copy_then_drop)
    assert not tm.copier.copy(got.slots, [0, 1, 2, 3])


def test_a_claimed_entry_is_not_published_and_a_stale_stamp_never_matches_a_new_entry(tm):
    tm.pf.claim("pf-b", [])  # nothing staged under it yet: no effect
    first = _stage(tm, "pf-a", 2)
    tm.pf.drop("pf-a", "released")
    second = _stage(tm, "pf-a", 2)  # the same owner, a record that may be the same: a new stamp
    assert second.slots.stamp != first.slots.stamp
    assert not tm.copier.copy(first.slots, [0, 1]) and tm.copier.copy(second.slots, [0, 1])
    e = tm.pf.entries["pf-a"]
    tm.pf.drop("pf-a", "released")
    e.claimed_until = 1.0
    assert tm.pf._publish(e) is None  # a fetch claimed it while it was staged: it copies it, not the engine


def test_a_full_table_or_an_unmappable_buffer_falls_back_to_the_fetch(tm):
    for i in range(8):  # the table holds 8 records
        assert _stage(tm, f"pf-{i}", 1, tag=bytes([65 + i])).slots is not None
    assert _stage(tm, "pf-x", 1, tag=b"x").slots is None  # no record left: claimed the usual way
    good = tm.pf.entries["pf-0"]
    gone = StagedSlots("no-such-buffer", tm.table.name, good.record, int(tm.table.stamps[good.record]), good.slots)
    assert not tm.copier.copy(gone, [0])


def test_runs_merge_consecutive_slots_into_consecutive_blocks():
    assert runs([0, 10, 20, 50], [100, 110, 120, 200], 10) == [(0, 100, 30), (50, 200, 10)]
    assert runs([0, 10], [110, 100], 10) == [(0, 110, 10), (10, 100, 10)]
