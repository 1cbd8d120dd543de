"""What a fetch puts on the wire (fetch_wire.py): the requests to the gateways and the DE's traffic
manager (messages, subjects, deadlines), what the engine hears (`ReadQueued`, `ReadFinished`,
`LayersLoaded`), every copy and one-sided read, the bytes and seconds it counts, its span, and
what it gives back afterwards."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest
from opentelemetry import trace

from services.traffic_manager import fetch as fetch_module
from services.traffic_manager.fetch import FetchPath
from services.traffic_manager.transfers import TransferKind, TransferState
from shared.messages.endpoints import EP
from shared.messages.storage_gateway import ReadBlocks
from shared.messages.traffic_manager import (FetchFailed, FetchKV, LayersLoaded, NodeReadDone, ReadFinished,
                                             ReadQueued, Reserve, Stage)
from shared.transport.base import Op, TrafficClass
from shared.transport.grants import decode_grant
from tests.unit.fetch_wire import (BN, DE, DE_NODE, DE_SLOT0, LAYERS, LAYOUT, LB, PE, PE_NODE, SUBJECTS, Wire,
                                   capture_spans, parts, sample)

pytestmark = pytest.mark.unit
KEYS = [bytes([i]) * 16 for i in range(5)]
DST = [6, 1, 8, 3, 12]
HELD = 15 * BN  # the prefetched first block, in this TM's own buffer
T = 1.0


def split(pe_blocks: int = 3, **kw) -> FetchKV:
    """Block 0 prefetched here, 1..pe_blocks-1 on the PE path, the rest on the DE path."""
    return FetchKV("r#0", KEYS, DST, PE_NODE, LAYOUT, pe_blocks=pe_blocks, de_engine=DE, de_node=DE_NODE,
                   prompt_blocks=6, staged_engine=PE, staged_owner="pf-1", staged_blocks=1, **kw)


@pytest.fixture
def spans(monkeypatch):
    return capture_spans(monkeypatch, fetch_module)


def run(wire: Wire, msg: FetchKV, gateways=((0.0, 0), (0.0, 0)), timeout_s: float = T, parent=None):
    """The fetch under a parent span; returns (parts, what drop_local was told)."""
    p, region, dropped = parts(wire, "t-fw", timeout_s, gateways, claim_local=lambda owner, keys: [HELD][:len(keys)])

    async def go():
        ctx = None
        if parent is not None:
            with parent.start_as_current_span("parent") as span:
                ctx = trace.set_span_in_context(span)
        await asyncio.wait_for(FetchPath(p).fetch(msg, SimpleNamespace(ctx=ctx)), 30)
    try:
        asyncio.run(go())
    finally:
        region.close()
        region.unlink()
    return p, dropped


def test_a_split_fetch_asks_reads_and_copies_exactly_its_blocks(spans):
    exporter, parent = spans
    wire = Wire()
    p, dropped = run(wire, split(), gateways=((11.0, 0), (7.0, 0)), parent=parent)
    reserve, read, stage = wire.asked
    de_slots = [(DE_SLOT0 + i) * BN for i in range(6)]
    assert reserve[:3] == (SUBJECTS.at(EP.TM_RESERVE, engine=DE), Reserve("r#0", 6), T)
    assert reserve[3] is p.peers_gone.future(DE)
    assert read[:2] == (SUBJECTS.at(EP.SG_READ, node=PE_NODE), ReadBlocks(
        "r#0", LAYOUT, KEYS[1:3], p.pool.buffer.name, [0, BN], group_layers=2, progress=p.progress_subject, tag="pe"))
    assert read[2] == pytest.approx(T + 1.5 * 4 / 11)  # its deadline counts the queue, itself included
    assert stage[:2] == (SUBJECTS.at(EP.TM_STAGE, engine=DE), Stage(
        "r#0", 6, 3, KEYS[3:], DE_NODE, LAYOUT, slots=de_slots, group_layers=2, progress=p.progress_subject))
    assert stage[2] == pytest.approx(T + 1.5 * 4 / 7) and stage[3] is p.peers_gone.future(DE)
    assert wire.names == ["read-r#0", "stage-r#0"]
    assert wire.heard == [
        (p.loaded_subject, ReadQueued("r#0", 0.429)),  # 1.5 x two blocks at 7 blocks/s
        (SUBJECTS.at(EP.READS_DONE), NodeReadDone("r#0", PE_NODE)),
        (SUBJECTS.at(EP.READS_DONE), NodeReadDone("r#0", DE_NODE)),
        (p.loaded_subject, ReadFinished("r#0", 5, de_slots=de_slots, de_hits=[3, 4], eta_s=0.1235, staged=1,
                                        de_read=2)),
        (p.loaded_subject, LayersLoaded("r#0", LAYERS - 1))]
    grant = decode_grant(_raw(wire, "r#0"))
    assert grant is not None and p.held.get("r#0", DE) == grant
    for layer in range(LAYERS):
        copy, pull = wire.moved[2 * layer: 2 * layer + 2]
        lbs = [DST[i] * LAYERS + layer for i in range(5)]
        assert copy == ("copy", "", [Op("buf", off + layer * LB, "kv", lbs[i] * LB, LB) for off, i in
                                     ((HELD, 0), (0, 1), (BN, 2))], TrafficClass.LATENCY, T, None)
        assert pull[:2] == ("read", DE) and pull[3:5] == (TrafficClass.LATENCY, T)
        assert pull[2] == [Op("kv", lbs[i] * LB, "buf", de_slots[i] + layer * LB, LB) for i in (3, 4)]
        assert pull[5] == grant and pull[3] is TrafficClass.LATENCY and copy[3] is TrafficClass.LATENCY
    assert len(wire.moved) == 2 * LAYERS
    assert {k: sample(p, "bytes_total", kind=k) for k in ("de_path_pull", "prefetch_used", "h2d_layers")} == {
        "de_path_pull": 2 * BN, "prefetch_used": BN, "h2d_layers": 3 * BN}
    for phase in ("read", "h2d"):  # the clock stood still: no time passed
        assert (sample(p, "fetch_seconds_count", phase=phase), sample(p, "fetch_seconds_sum", phase=phase)) == (1, 0)
    # everything given back: the PE-buffer slots, the read tracks, the prefetched blocks
    assert p.pool.slots.owners() == [] and p.reads.items == {} and dropped == [("pf-1", "used")]
    assert p.xfers.ended == {(TransferKind.FETCH, TransferState.DONE): 1}
    (fetch_span,) = [s for s in exporter.get_finished_spans() if s.name == "kv_fetch"]
    assert fetch_span.parent is not None and fetch_span.parent.span_id == _span_id(exporter, "parent")
    attrs = dict(fetch_span.attributes)
    assert attrs == {"req_id": "r#0", "blocks": 5, "pe_path_blocks": 3, "de_path_blocks": 2, "pe_node": PE_NODE,
                     "de_node": DE_NODE, "blocks_ok": 5, "pe_ok": 2, "de_ok": 2, "prefetched_blocks": 1,
                     "read_at_arrival_blocks": 4, "error": ""}
    assert [e.attributes["state"] for e in fetch_span.events if e.name == "transfer"] == [
        "reserving", "reading", "copying", "done"]
    assert [e.attributes["req_id"] for e in fetch_span.events] == ["r#0"] * 4


def _raw(wire: Wire, req_id: str) -> bytes:
    return wire.given._by_req[req_id][1]


def _span_id(exporter, name: str) -> int:
    return next(s for s in exporter.get_finished_spans() if s.name == name).context.span_id


@pytest.mark.parametrize("gateways, pe_blocks, queued, timeout_s", [
    (((7.0, 0), (11.0, 0)), 3, 0.429, T),  # the PE path's queue is the longer
    (((11.0, 0), (7.0, 0)), 3, 0.429, T),  # the DE path's
    (((24.0, 0), (12.0, 0)), 3, None, T),  # 0.25 s: a quarter of the deadline is not long enough to tell
    (((11.0, 0), (7.0, 0)), 3, None, 2.0),  # 0.429 s of a 2 s deadline
    (((0.0, 0), (12.0, 4)), 5, None, T),  # no DE path: the DE node's queue is none of its business
])
def test_the_engine_hears_of_a_storage_queue_a_quarter_of_the_deadline_long(spans, gateways, pe_blocks, queued,
                                                                             timeout_s):
    wire = Wire()
    p, _ = run(wire, split(pe_blocks), gateways=gateways, timeout_s=timeout_s)
    assert [m.eta_s for m in wire.of(ReadQueued)] == ([queued] if queued else [])
    assert not wire.of(FetchFailed)
