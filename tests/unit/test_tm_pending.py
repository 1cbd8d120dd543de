"""A DE turn's saved blocks kept in the buffer for its next turn: the prompt's slots and each
generated block's slot join one pending entry, `HoldSaves` offers the leading blocks that match
the turn's keys (a prompt whose last saved key is not the scheduler's is not offered), a save
short of room takes kept slots (never a prefetch's), and a slot a storage write still reads is
never free before that write ends, whoever held it and whatever freed it."""
from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from services.traffic_manager.pending import PendingSaves, owner_of
from services.traffic_manager.pool import PARKED
from services.traffic_manager.prefetch import Entry, PrefetchPath
from services.traffic_manager.saves import SaveLine
from services.traffic_manager.transfers import Transfers
from shared.messages.registry import KVRegion
from shared.messages.storage_gateway import StoreLayout
from shared.messages.traffic_manager import HoldSaves, SaveKV
from tests.unit.tm_util import Reply, buffer_pool

pytestmark = pytest.mark.unit
BLOCK = 4096
LAYOUT = StoreLayout(b"f" * 16, "m", 2, 1, 8, "float32", 16)


@pytest.fixture
def parts():
    region, pool, m = buffer_pool("t-pd", 16 * BLOCK, KVRegion("kv", 8, 16, 2, BLOCK, BLOCK // 2))
    yield SimpleNamespace(cfg=SimpleNamespace(transfer_timeout_s=5.0, fault_flip_pending_bytes=False), pool=pool,
                          metrics=m, m_bytes=m.counter("bytes_total", "b", ("kind",)), xfers=Transfers())
    region.close()
    region.unlink()


def _keys(n, tag=b"k"):
    return [tag + bytes([i]) * 15 for i in range(n)]


def test_a_pinned_slot_freed_meanwhile_waits_for_its_write(parts):
    pool = parts.pool
    a = pool.slots.allocate("a", 3)
    pool.pin(a[:2])
    pool.release("a")
    assert pool.slots.free == 14 and pool.slots.held(PARKED) == a[:2]
    pool.unpin([a[0]])
    assert pool.slots.free == 15
    pool.pin([a[1]])  # pinned twice: free after the second write
    pool.unpin([a[1]])
    assert pool.slots.free == 15
    pool.unpin([a[1]])
    assert pool.slots.free == 16 and not pool.pinned
    pool.slots.check_integrity()


def _kept(parts, n_prompt=4, saved_from=2, gen=2, wait_s=30.0, pf=None):
    """Request r1 holds n_prompt DE-buffer slots; its prompt's save (from `saved_from`) and `gen` generated saves."""
    pool, bn = parts.pool, parts.pool.block_nbytes
    pf = pf or PrefetchPath(parts, chunk_blocks=8, share=0.5)
    pend = PendingSaves(parts, pf, wait_s=wait_s)
    pool.before_free = pend.take
    keys = _keys(n_prompt + gen)
    held = pool.slots.allocate("r1", n_prompt + 1)  # one more than the prompt's full blocks (its partial one)
    pool.pin(held[saved_from:n_prompt])
    pend.keep_prompt(SaveKV("r1", [], keys[saved_from:n_prompt], "n0", LAYOUT,
                            slots=[s * bn for s in held[saved_from:n_prompt]]))
    assert owner_of("r1") not in pf.entries  # the request's own until it lets them go (loaded into KV memory)
    pool.free("r1")
    for i in range(gen):
        own = f"r1/save/{i}"
        pool.slots.allocate(own, 1)
        pend.keep_generated(SaveKV("r1", [7], [keys[n_prompt + i]], "n0", LAYOUT), own)
    return pf, pend, keys, held


def test_the_turns_blocks_are_offered_in_order_and_freed_with_the_entry(parts):
    pool = parts.pool
    pf, pend, keys, held = _kept(parts)
    owner = owner_of("r1")
    assert pool.slots.held("r1") == [] and pool.slots.free == 16 - 6 - 0  # its partial block went back
    reply = Reply()
    asyncio.run(pend.on_hold(HoldSaves("r1", keys + _keys(1, b"z"), 10.0), reply))
    assert reply.msg.blocks == 6 and not reply.msg.error
    e = pf.entries[owner]
    assert e.keys == keys and e.slots[:4] == [s * pool.block_nbytes for s in held[:4]]
    assert pf.claim(owner, keys[:5]) == e.slots[:5]
    assert pf.drop(owner, "released")
    assert pool.slots.free == 14  # the two blocks still being written wait
    pool.unpin(held[2:4])
    assert pool.slots.free == 16
    pool.slots.check_integrity()


def test_an_idle_sweep_wakes_for_a_kept_turn_and_frees_it_when_nobody_asks(parts):
    """The prefetch sweep sleeps while it holds nothing; a kept turn must wake it, or its slots stay held."""
    pool = parts.pool
    pf = PrefetchPath(parts, chunk_blocks=8, share=0.5)

    async def run():
        sweep = asyncio.ensure_future(pf.sweep())
        for _ in range(3):  # let the sweep find nothing and go to sleep on `added`
            await asyncio.sleep(0)
        _kept(parts, wait_s=0.01, pf=pf)
        owner = owner_of("r1")
        assert owner in pf.entries and pool.slots.free < 16
        for _ in range(200):  # no HoldSaves comes: the entry runs out (a guard, not a timing bound)
            if owner not in pf.entries:
                break
            await asyncio.sleep(0.05)
        sweep.cancel()
        return owner

    owner = asyncio.run(run())
    assert owner not in pf.entries
    assert pool.slots.free == 14  # every kept slot back but the two still being written
    pool.slots.check_integrity()


def test_a_prompt_whose_keys_differ_is_not_offered(parts):
    pf, pend, keys, _ = _kept(parts)
    reply = Reply()
    asyncio.run(pend.on_hold(HoldSaves("r1", _keys(6, b"o"), 10.0), reply))
    assert reply.msg.blocks == 0 and owner_of("r1") not in pf.entries


def test_a_save_short_of_room_takes_kept_slots_never_a_prefetchs(parts):
    pool = parts.pool
    pf, pend, keys, _ = _kept(parts, n_prompt=4, saved_from=3, gen=0)
    pool.unpin(pool.slots.held(owner_of("r1"))[3:])  # written
    pf.entries["pf-x"] = Entry("pf-x", time.monotonic() + 60)
    pool.slots.allocate("pf-x", 8)
    pool.slots.allocate("other", 4)
    line = SaveLine(pool, 64, 0.2, parts.metrics.gauge("q", "q"),
                    parts.metrics.counter("saved", "s", ("outcome",)))
    line.reclaim = lambda n: pf.reclaim(n, pending_only=True)
    got = asyncio.run(line.take("save-1", 3))
    assert got is not None and len(got) == 3
    assert owner_of("r1") not in pf.entries and "pf-x" in pf.entries
