"""The traffic manager's fetch, per block and layer (dp_mesh.py): every hit is read from storage once,
by one node (a prefetched one not at all), and each of its layers reaches its KV block once: the PE
path's by a local copy, the decode side's hits by one one-sided read from their DE-buffer slot,
which the engine is told (`ReadFinished.de_hits`: never pushed back). No block's last layer reaches
KV memory before the read's checksums passed (earlier layers overlap the read); a block failing
them fails the load (`FetchFailed`) with its last layer never copied."""
from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest

from shared.messages.traffic_manager import FetchFailed, FetchKV, LayersLoaded, ReadFinished
from tests.unit.dp_mesh import BLOCK, DE, DE_NODE, LAYERS, LAYOUT, PE, PE_NODE, Mesh, Tasks

pytestmark = pytest.mark.unit
KEYS = [bytes([i]) * 16 for i in range(5)]
DST = [6, 1, 8, 3, 12]  # the engine's KV blocks for the five hits
PREFETCHED = 15 * BLOCK  # a PE-buffer slot holding the first hit, prefetched during a tool call
IDLE_TURNS = 200  # event-loop turns without a copy after which a fetch counts as waiting
GUARD_S = 60.0  # a hang fails the test instead of the run (no test here waits for it)


def _fetch(pe_blocks: int, staged: int = 0, n: int = len(KEYS)) -> FetchKV:
    return FetchKV("r#0", KEYS[:n], DST[:n], PE_NODE, LAYOUT, pe_blocks, de_engine=DE, de_node=DE_NODE,
                   prompt_blocks=7, staged_engine=PE if staged else "", staged_owner="pf-1" if staged else "",
                   staged_blocks=staged)


def _run(test, prefetched: list[int] = ()) -> tuple[Mesh, object]:
    """(the mesh, what `test(mesh)` returned)."""
    async def go():
        mesh = Mesh(Tasks(), prefetched)
        try:
            return mesh, await asyncio.wait_for(test(mesh), GUARD_S)
        finally:
            mesh.close()
    return asyncio.run(go())


def _heard(mesh: Mesh, kind):
    return [m for _, m in mesh.heard if isinstance(m, kind)]


@pytest.mark.parametrize(("pe_blocks", "staged"), [(0, 0), (2, 0), (3, 1), (5, 0)],
                         ids=["de-path", "split", "prefetched-split", "pe-path"])
def test_decode_side_hits_are_pulled_once_and_no_hit_is_read_twice(pe_blocks, staged):
    async def test(mesh: Mesh):
        await mesh.fetch_path.fetch(_fetch(pe_blocks, staged), SimpleNamespace(ctx=None))
    mesh, _ = _run(test, [PREFETCHED])
    k, n = max(pe_blocks, staged), len(KEYS)
    assert not _heard(mesh, FetchFailed)
    done = _heard(mesh, ReadFinished)
    assert len(done) == 1 and done[0].blocks == n
    assert done[0].de_hits == list(range(k, n)), "the decode side's hits are not marked for the engine"
    de_slots = mesh.reserved.get("r#0", [])
    assert done[0].de_slots == (de_slots if k < n else [])
    # storage: each hit read once, by one node; a prefetched one not at all
    read = [key for _, keys in mesh.storage.reads for key in keys]
    assert Counter(read) == Counter(KEYS[staged:])
    assert sorted(mesh.storage.reads) == sorted([(node, keys) for node, keys in
                                                 ((PE_NODE, KEYS[staged:k]), (DE_NODE, KEYS[k:])) if keys])
    # KV memory: each layer of each hit once, from where it was staged
    assert Counter((m.kv_block, m.layer) for m in mesh.moved) == Counter(
        (DST[i], layer) for i in range(n) for layer in range(LAYERS))
    for m in mesh.moved:
        i = DST.index(m.kv_block)
        if i >= k:  # a decode-side hit: pulled from its DE-buffer slot
            assert (m.peer, m.kind, m.buf_block) == (DE, "read", de_slots[i]), m
        else:  # the PE path (or prefetched into this TM's buffer): a local copy
            assert (m.peer, m.kind) == ("", "copy"), m
            assert (m.buf_block == PREFETCHED) == (i < staged), m


async def _fetch_behind_checksums(mesh: Mesh, msg: FetchKV) -> bool:
    """The fetch, while the gateways hold back their verdicts until every layer but the last has
    reached KV memory (or nothing moved for a while), and a little longer (a copy that did not
    wait for them happens meanwhile). Returns whether those layers came in before the verdicts."""
    gate = mesh.storage.gate = asyncio.Event()
    early = {(b, layer) for b in msg.dst_blocks for layer in range(LAYERS - 1)}
    task = asyncio.ensure_future(mesh.fetch_path.fetch(msg, SimpleNamespace(ctx=None)))
    idle, seen = 0, 0
    while not early <= {(m.kv_block, m.layer) for m in mesh.moved} and idle < IDLE_TURNS and not task.done():
        await asyncio.sleep(0)
        idle, seen = (0, len(mesh.moved)) if len(mesh.moved) != seen else (idle + 1, seen)
    pipelined = early <= {(m.kv_block, m.layer) for m in mesh.moved}
    for _ in range(IDLE_TURNS):
        await asyncio.sleep(0)
    gate.set()
    await task
    return pipelined


@pytest.mark.parametrize("pe_blocks", [2, 0], ids=["pe-path", "de-path"])
def test_no_last_layer_reaches_kv_memory_before_its_blocks_checksums_passed(pe_blocks):
    msg = _fetch(pe_blocks, n=2)
    mesh, pipelined = _run(lambda mesh: _fetch_behind_checksums(mesh, msg))
    assert pipelined, "the layers before the last did not reach KV memory while the read was checked"
    assert not _heard(mesh, FetchFailed)
    last = [m for m in mesh.moved if m.layer == LAYERS - 1]
    assert sorted(m.kv_block for m in last) == sorted(msg.dst_blocks)
    assert all(m.verified for m in last), [m for m in last if not m.verified]
    assert _heard(mesh, LayersLoaded)[-1].layer == LAYERS - 1


@pytest.mark.parametrize("pe_blocks", [2, 0], ids=["pe-path", "de-path"])
def test_a_block_failing_its_checksum_fails_the_load_before_its_last_layer_is_copied(pe_blocks):
    msg = _fetch(pe_blocks, n=2)

    async def test(mesh: Mesh):
        mesh.storage.passing = {"pe": 1, "de": 1}  # the second block's checksum fails
        return await _fetch_behind_checksums(mesh, msg)
    mesh, pipelined = _run(test)
    assert pipelined, "the layers before the last did not reach KV memory while the read was checked"
    assert not [m for m in mesh.moved if m.layer == LAYERS - 1], "a layer of an unverified read completed a block"
    failed = _heard(mesh, FetchFailed)
    assert len(failed) == 1 and failed[0].layers == LAYERS - 1, failed
    assert not [m for m in _heard(mesh, LayersLoaded) if m.layer >= LAYERS - 1]
