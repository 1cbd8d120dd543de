"""Where a fetch's hits come from, on the wire (fetch_wire.py): one read path alone, blocks
prefetched here, at another traffic manager (claimed, read under its grant) or adopted in the
DE's buffer; every copy of a layer settles before a failure is told; a block failing its
checksum after its layers were read fails the load."""
from __future__ import annotations

import asyncio

import pytest

from services.traffic_manager.fetch import FetchPath  # noqa: F401 - run() drives it
from shared.messages.codes import ErrorCode
from shared.messages.storage_gateway import ReadBlocks, ReadDone
from shared.messages.traffic_manager import (Claim, Claimed, FetchFailed, FetchKV, ReadFinished, Reserve, Reserved,
                                             Stage)
from shared.transport.grants import decode_grant
from tests.unit.fetch_wire import BN, DE, DE_NODE, DE_SLOT0, LAYERS, LAYOUT, PE, PE_NODE, Wire
from tests.unit.test_tm_fetch_wire import DST, KEYS, run, spans  # noqa: F401 - the fixture

pytestmark = pytest.mark.unit
HOLDER = "pe-2"  # another prefill engine's TM, holding a prefetch
HELD = [3 * BN, 9 * BN, 4 * BN, 11 * BN, 2 * BN]  # the holder's slots of the prefetched blocks


def _fetch(pe_blocks: int, staged_engine: str = "", staged: int = 0) -> FetchKV:
    return FetchKV("r#0", KEYS, DST, PE_NODE, LAYOUT, pe_blocks=pe_blocks, de_engine=DE, de_node=DE_NODE,
                   prompt_blocks=6, staged_engine=staged_engine, staged_owner="pf-1" if staged else "",
                   staged_blocks=staged)


def _events(exporter) -> list[str]:
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "kv_fetch"]
    return [e.attributes["state"] for e in span.events if e.name == "transfer"]


@pytest.mark.parametrize("pe_blocks, kinds, de_slots", [
    (0, {("read", DE)}, [(DE_SLOT0 + i) * BN for i in range(6)]),  # the DE path alone: pulled, no local copy
    (5, {("copy", "")}, []),  # the PE path alone: nothing reserved at the DE
])
def test_one_read_path_alone(spans, pe_blocks, kinds, de_slots):
    exporter, _ = spans
    wire = Wire()
    p, _ = run(wire, _fetch(pe_blocks))
    assert {(m[0], m[1]) for m in wire.moved} == kinds and all(m[2] for m in wire.moved)
    assert len(wire.moved) == LAYERS
    (done,) = wire.of(ReadFinished)
    assert (done.blocks, done.de_slots, done.de_read) == (5, de_slots, 5 - pe_blocks)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "kv_fetch"]
    ok = (5, 0) if pe_blocks else (0, 5)
    assert (span.attributes["pe_ok"], span.attributes["de_ok"], span.attributes["error"]) == (*ok, "")
    assert [type(m) for _, m, _, _ in wire.asked] == ([ReadBlocks] if pe_blocks else [Reserve, Stage])


def _holder(wire: Wire):
    async def claim(msg: Claim) -> Claimed:
        n = len(msg.block_keys)
        return Claimed(slots=HELD[:n], grant=wire.given.give("claim", HELD[:n], BN))
    return claim


@pytest.mark.parametrize("staged_engine, staged", [(PE, 1), (HOLDER, 5), (HOLDER, 1), (DE, 5)])
def test_prefetched_blocks_are_read_from_where_they_sit_under_that_holders_grant(spans, staged_engine, staged):
    exporter, _ = spans
    wire = Wire()
    wire.on[Claim] = _holder(wire)

    async def adopt(msg: Reserve) -> Reserved:
        slots = [(DE_SLOT0 + i) * BN for i in range(msg.n_blocks)]
        return Reserved(slots=slots, grant=wire.given.give(msg.req_id, slots, BN), adopted=len(msg.adopt_block_keys))
    wire.on[Reserve] = adopt
    pe_blocks = 5 if staged == 5 else 3
    p, _ = run(wire, _fetch(pe_blocks, staged_engine, staged))
    assert not wire.of(FetchFailed)
    (done,) = wire.of(ReadFinished)
    assert (done.blocks, done.staged) == (5, staged)
    from_holder = HOLDER if staged_engine == HOLDER else DE  # the DE path's pulls are not the prefetch's here
    remote = [m for m in wire.moved if m[0] == "read" and (m[1] == from_holder if staged < 5 else True)]
    if staged_engine == PE:
        assert [m for m in wire.moved if m[0] == "copy"] and not [m for m in wire.moved if m[1] == HOLDER]
    else:
        source, owner = (DE, "r#0") if staged_engine == DE else (HOLDER, "claim")
        grant = decode_grant(wire.given._by_req[owner][1])
        assert remote and all((m[1], m[5]) == (source, grant) for m in remote)
        assert sum(len(m[2]) for m in remote) == staged * LAYERS  # each layer of each prefetched block once
    states = ["reserving", "reading", "copying", "done"]
    assert _events(exporter) == states


def test_an_adoption_refused_claims_then_reserves_afresh(spans):
    wire = Wire()
    reserves = []

    async def reserve(msg: Reserve) -> Reserved:
        reserves.append(msg)
        if msg.adopt:
            return Reserved(ok=False, error="DE buffer full", code=ErrorCode.BUFFER_FULL)
        slots = [(DE_SLOT0 + i) * BN for i in range(msg.n_blocks)]
        return Reserved(slots=slots, grant=wire.given.give(msg.req_id, slots, BN))
    wire.on[Reserve], wire.on[Claim] = reserve, _holder(wire)
    p, _ = run(wire, _fetch(2, DE, 2))
    assert [type(m) for _, m, _, _ in wire.asked] == [Reserve, Claim, Reserve, Stage]
    assert [(r.adopt, len(r.adopt_block_keys)) for r in reserves] == [("pf-1", 2), ("", 0)]
    (done,) = wire.of(ReadFinished)
    assert (done.blocks, done.staged, done.de_read) == (5, 2, 3)


def test_every_copy_of_a_layer_settles_before_the_failure_is_told(spans):
    wire = Wire()
    order: list[str] = []

    async def on_move(kind, ops):
        if kind == "copy":
            raise RuntimeError("copy failed")
        for _ in range(20):
            await asyncio.sleep(0)
        order.append("pulled")

    async def heard(msg):
        if isinstance(msg, FetchFailed):
            order.append("failed")
    wire.on_move, wire.on_publish = on_move, heard
    run(wire, _fetch(3))
    assert order == ["pulled", "failed"]


def test_a_block_failing_its_checksum_after_its_layers_were_read_fails_the_load(spans):
    wire = Wire()

    async def read(msg: ReadBlocks) -> ReadDone:
        track = wire.parts.reads.get((msg.req_id, "pe"))
        track.opened, track.layers = len(msg.block_keys), LAYERS
        track.note()
        return ReadDone(blocks=1, error="block 1: checksum mismatch")
    wire.on[ReadBlocks] = read
    run(wire, _fetch(5))
    assert [(m.code, m.error) for m in wire.of(FetchFailed)] == [
        (ErrorCode.STORAGE, "read: block 1 failed verification after its layers were read: block 1: checksum mismatch")]
