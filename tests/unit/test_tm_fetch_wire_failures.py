"""How a fetch fails on the wire (fetch_wire.py): a read path lost before the read leaves fewer hits
(`ReadFinished`, the reason on the span); a failure after it is one `FetchFailed` with its code,
its reason and the layers already in place; a silent read or push is given up on at the deadline
the storage queues allow; a bug is answered too, then raised."""
from __future__ import annotations

import asyncio

import pytest

from services.traffic_manager.progress import Stalled
from services.traffic_manager.transfers import TransferKind, TransferState
from shared.bus import BusError
from shared.kv.allocator import OutOfSlots
from shared.messages.codes import ErrorCode
from shared.messages.storage_gateway import ReadBlocks, ReadDone
from shared.messages.traffic_manager import (FetchFailed, FetchKV, KVWindow, LayersLoaded, NodeReadDone, ReadFinished,
                                             Reserve, Reserved, Stage, Staged)
from shared.transport.errors import TransportError
from tests.unit.fetch_wire import BN, DE_NODE, DE_SLOT0, LAYERS, LAYOUT, PE_NODE, Wire
from tests.unit.test_tm_fetch_wire import run, spans, split  # noqa: F401 - the fixture

pytestmark = pytest.mark.unit


def _failed(wire: Wire) -> tuple:
    (subject, msg), = [(s, m) for s, m in wire.heard if isinstance(m, FetchFailed)]
    return subject, msg


def _copy_fails(exc: Exception, at_layer: int):
    async def on_move(kind, ops):
        if kind == "copy" and (ops[0].remote_offset // 1024) % LAYERS == at_layer:
            raise exc
    return on_move


@pytest.mark.parametrize("exc, code, why, raised", [
    (TransportError("link down"), ErrorCode.KV_TRANSFER, "TransportError: link down", False),
    (BusError("copy", "peer gone", ErrorCode.NOT_READY), ErrorCode.STORAGE, "copy: peer gone", False),
    (RuntimeError("ring gone"), ErrorCode.STORAGE, "ring gone", False),
    (ValueError("a bug"), ErrorCode.INTERNAL, "ValueError: a bug", True),  # answered, then raised
])
def test_a_copy_failing_fails_the_load_with_the_layers_in_place(spans, exc, code, why, raised):
    exporter, _ = spans
    wire = Wire()
    wire.on_move = _copy_fails(exc, 2)
    if raised:
        with pytest.raises(type(exc)):
            run(wire, split())
        return
    p, dropped = run(wire, split())
    subject, failed = _failed(wire)
    assert (subject, failed) == (p.loaded_subject, FetchFailed("r#0", code, why, 2))
    assert wire.of(LayersLoaded) == []  # the clock stood still, nothing was waited for: none announced
    assert p.xfers.ended == {(TransferKind.FETCH, TransferState.FAILED): 1}
    assert p.pool.slots.owners() == [] and p.reads.items == {} and dropped == [("pf-1", "used")]
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "kv_fetch"]
    assert [e.attributes["exception.message"] for e in span.events if e.name == "exception"] == [str(
        BusError("fetch", str(exc)) if isinstance(exc, RuntimeError) else exc)]


def test_a_bug_is_answered_as_internal_before_it_is_raised(spans):
    wire = Wire()
    wire.on_move = _copy_fails(ValueError("a bug"), 0)
    with pytest.raises(ValueError):
        run(wire, split())
    assert [(m.code, m.error, m.layers) for m in wire.of(FetchFailed)] == [(ErrorCode.INTERNAL, "ValueError: a bug", 0)]


async def _refused(msg):
    return Reserved(ok=False, error="DE buffer full", code=ErrorCode.BUFFER_FULL)


async def _gone(msg):
    raise BusError("reserve", "DE gone")


@pytest.mark.parametrize("answer, why", [(_refused, "DE buffer full"), (_gone, "DE gone")])
def test_no_de_buffer_room_leaves_the_pe_path_alone(spans, answer, why):
    exporter, _ = spans
    wire = Wire()
    wire.on[Reserve] = answer
    p, _ = run(wire, split())
    assert [type(m) for _, m, _, _ in wire.asked] == [Reserve, ReadBlocks]
    assert wire.of(NodeReadDone) == [NodeReadDone("r#0", DE_NODE), NodeReadDone("r#0", PE_NODE)]
    assert wire.of(ReadFinished) == [ReadFinished("r#0", 3, eta_s=0.1235, staged=1)]
    assert not wire.of(FetchFailed) and {m[1] for m in wire.moved} == {""}  # nothing pulled from the DE
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "kv_fetch"]
    assert (span.attributes["blocks_ok"], span.attributes["de_ok"], span.attributes["error"]) == (3, 0, why)


async def _read_lost(msg):
    raise BusError("read", "gateway gone")


async def _stage_lost(msg):
    raise BusError("stage", "DE TM gone")


async def _short_read(msg):
    return ReadDone(blocks=1, stop_reason="block 2: not stored")


async def _short_stage(msg):
    return Staged(slots=msg.slots, blocks=1, error="block 4: checksum mismatch")


@pytest.mark.parametrize("kind, answer, blocks, de_hits, why", [
    (ReadBlocks, _read_lost, 1, [], "gateway gone"),  # the PE path's hits lost: the DE path's are no use
    (ReadBlocks, _short_read, 2, [], "block 2: not stored"),
    (Stage, _stage_lost, 3, [], "DE TM gone"),
    (Stage, _short_stage, 4, [3], "block 4: checksum mismatch"),
])
def test_a_read_that_stops_short_leaves_fewer_hits_and_says_why(spans, kind, answer, blocks, de_hits, why):
    exporter, _ = spans
    wire = Wire()
    wire.on[kind] = answer
    p, _ = run(wire, split())
    (done,) = wire.of(ReadFinished)
    reserved = [(DE_SLOT0 + i) * BN for i in range(6)]
    assert (done.blocks, done.de_hits, done.de_slots) == (blocks, de_hits, reserved if de_hits else [])
    assert sorted(m.node for m in wire.of(NodeReadDone)) == [PE_NODE, DE_NODE]
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "kv_fetch"]
    assert (span.attributes["blocks_ok"], span.attributes["error"]) == (blocks, why)
    assert not wire.of(FetchFailed)


def test_more_pe_path_blocks_than_the_buffer_holds_are_computed(spans):
    exporter, _ = spans
    wire = Wire()
    keys = [bytes([i]) * 16 for i in range(18)]
    p, _ = run(wire, FetchKV("r#0", keys, list(range(18)), PE_NODE, LAYOUT, pe_blocks=18))
    assert wire.asked == [] and wire.names == []
    assert wire.of(ReadFinished) == [ReadFinished("r#0", 0)]
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "kv_fetch"]
    assert span.attributes["error"] == f"PE buffer full: {OutOfSlots(18, 16)}"
    assert p.pool.slots.owners() == []


@pytest.mark.parametrize("silent, what", [("pe", "PE-path read opened"), ("de", "DE-path read opened")])
@pytest.mark.parametrize("gateways, limit", [(((100.0, 0), (200.0, 0)), 0.08), (((200.0, 0), (100.0, 0)), 0.08),
                                             (((400.0, 0), (400.0, 0)), 0.0575)])
def test_a_silent_read_is_given_up_on_at_its_queues_deadline(spans, silent, what, gateways, limit):
    wire = Wire()
    wire.silent = {silent}
    with pytest.raises(Stalled):
        run(wire, split(), gateways=gateways, timeout_s=0.05)
    assert [(m.code, m.error) for m in wire.of(FetchFailed)] == [
        (ErrorCode.INTERNAL, f"Stalled: {what} not within {limit:g} s of the last progress")]
    assert not wire.of(ReadFinished)


def test_a_read_whose_layers_stop_coming_fails_the_load(spans):
    wire = Wire()
    wire.streamed, wire.hold = 0, {"pe": asyncio.Event(), "de": asyncio.Event()}
    run(wire, split(), timeout_s=0.05)
    assert [(m.code, m.error, m.layers) for m in wire.of(FetchFailed)] == [
        (ErrorCode.STORAGE, "layer 0 read from storage not within 0.05 s of the last progress", 0)]


def test_a_window_slot_nobody_pushes_on_fails_the_load(spans):
    wire = Wire()
    window = KVWindow(5, [30, 31, 32], 2)
    p, _ = run(wire, split(window=window), timeout_s=0.05)
    assert [(m.code, m.error, m.layers) for m in wire.of(FetchFailed)] == [
        (ErrorCode.STORAGE, "layer 0 pushed on not within 0.05 s of the last progress", 2)]
    assert p.layers.items == {}
