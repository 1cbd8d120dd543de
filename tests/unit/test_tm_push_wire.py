"""What a push puts on the wire (fetch_wire.py): its `Reserve`, every one-sided write (whole blocks,
or layer by layer as the engine computes them, hit-window layers from the ring), its `PushDone`
(ok, or the code and reason of what failed), the bytes and seconds it counts and its span."""
from __future__ import annotations

import asyncio

import pytest
from opentelemetry import trace

from services.traffic_manager import push as push_module
from services.traffic_manager.fetch import FetchPath
from services.traffic_manager.progress import LayerState
from services.traffic_manager.push import PushPath
from shared.messages.codes import ErrorCode
from shared.messages.endpoints import EP
from shared.messages.traffic_manager import KVWindow, PushDone, PushKV, Reserve, Reserved
from shared.transport.base import Op, TrafficClass
from shared.transport.errors import TransportError
from shared.transport.grants import decode_grant
from tests.unit.fetch_wire import BN, DE, DE_SLOT0, LAYERS, LB, SUBJECTS, Clock, Wire, capture_spans, parts, sample
from tests.unit.tm_util import Reply

pytestmark = pytest.mark.unit
T = 1.0
SRC = [6, 1, 8, 3]
SLOTS = [(DE_SLOT0 + i) * BN for i in range(4)]


@pytest.fixture
def spans(monkeypatch):
    return capture_spans(monkeypatch, push_module)


def push(wire: Wire, msg: PushKV, state: LayerState | None = None, timeout_s: float = T, attached: bool = True,
         parent=None, before=lambda p: None):
    """(the reply, the parts)."""
    p, region, _ = parts(wire, "t-pw", timeout_s)
    if not attached:
        p.pool.slots = None
    before(p)
    reply = Reply()

    async def go():
        reply.ctx = None
        if parent is not None:
            with parent.start_as_current_span("parent") as span:
                reply.ctx = trace.set_span_in_context(span)
        path = PushPath(p, p.metrics.histogram("transfer_seconds", "x", ("kind",)))
        await asyncio.wait_for(path.push(msg, reply, state), 30)
    try:
        asyncio.run(go())
    finally:
        region.close()
        region.unlink()
    return reply.msg, p


def _span(exporter):
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "kv_transfer"]
    return span


def test_a_whole_push_reserves_adopts_and_writes_the_rest(spans, monkeypatch):
    exporter, parent = spans
    monkeypatch.setattr(push_module, "time", Clock(1.0))  # the push takes one second
    wire = Wire()

    async def reserve(msg):
        return Reserved(slots=SLOTS, grant=wire.given.give(msg.req_id, SLOTS, BN), adopted=1)
    wire.on[Reserve] = reserve
    msg = PushKV("r#0", SRC, DE, 64, skip=[2], adopt="pf-1", adopt_block_keys=[b"k" * 16])
    done, p = push(wire, msg, parent=parent, before=lambda p: p.held.keep("r#0", DE, wire.given.give("x", [0], BN)))
    assert done == PushDone(slots=SLOTS, nbytes=2 * BN, seconds=1.0)
    (subject, ask, timeout, abort), = wire.asked
    assert (subject, ask, timeout) == (SUBJECTS.at(EP.TM_RESERVE, engine=DE), Reserve(
        "r#0", 4, adopt="pf-1", adopt_block_keys=[b"k" * 16]), T)
    assert abort is p.peers_gone.future(DE)
    (kind, peer, ops, cls, timeout, grant), = wire.moved
    assert (kind, peer, cls, timeout) == ("write", DE, TrafficClass.LATENCY, T) and cls is TrafficClass.LATENCY
    assert ops == [Op("kv", SRC[i] * BN, "buf", SLOTS[i], BN) for i in (1, 3)]
    assert grant == decode_grant(wire.given._by_req["r#0"][1])
    assert (sample(p, "bytes_total", kind="pd_push"), sample(p, "bytes_total", kind="prefetch_used")) == (2 * BN, BN)
    assert (sample(p, "transfer_seconds_count", kind="pd_push"), sample(p, "transfer_seconds_sum", kind="pd_push")) == (
        1, 1.0)
    assert p.held.get("r#0", DE) is None  # the request's last transfer here: its grants go
    span = _span(exporter)
    assert span.parent.span_id == next(s for s in exporter.get_finished_spans() if s.name == "parent").context.span_id
    assert dict(span.attributes) == {"req_id": "r#0", "dst_engine": DE, "blocks": 4, "transport": "shm",
                                     "layerwise": False, "blocks_sent": 2, "blocks_skipped": 2, "blocks_adopted": 1,
                                     "bytes": 2 * BN}
    assert [e.attributes["state"] for e in span.events if e.name == "transfer"] == ["reserving", "copying", "done"]


def test_on_the_de_read_path_it_writes_into_the_slots_it_was_given_under_the_grant_held(spans):
    exporter, _ = spans
    wire = Wire()
    raw = wire.given.give("r#0", SLOTS, BN)
    done, p = push(wire, PushKV("r#0", SRC, DE, 64, dst_slots=SLOTS, skip=[0, 1]),
                   before=lambda p: p.held.keep("r#0", DE, raw))
    assert done == PushDone(slots=SLOTS, nbytes=2 * BN, seconds=0.0) and wire.asked == []
    assert [(m[2], m[5]) for m in wire.moved] == [
        ([Op("kv", SRC[i] * BN, "buf", SLOTS[i], BN) for i in (2, 3)], decode_grant(raw))]
    assert [e.attributes["state"] for e in _span(exporter).events if e.name == "transfer"] == ["copying", "done"]


async def _refused(msg):
    return Reserved(ok=False, error="DE buffer full", code=ErrorCode.BUFFER_FULL)


async def _write_fails(kind, ops):
    raise TransportError("peer gone")


async def _write_cancelled(kind, ops):
    raise RuntimeError("released")


@pytest.mark.parametrize("case, error, code", [
    ("detached", "push: engine KV memory not attached yet", ErrorCode.NOT_READY),
    ("no grant", "push: no data-plane grant held for de-1's slots of r#0", ErrorCode.KV_TRANSFER),
    ("refused", "reserve: DE buffer full", ErrorCode.BUFFER_FULL),
    ("write", "peer gone", ErrorCode.KV_TRANSFER),
    ("cancelled", "released", ErrorCode.CANCELLED),
])
def test_a_failed_push_answers_why_and_tells_a_waiting_fetch(spans, case, error, code):
    exporter, _ = spans
    wire = Wire()
    wire.on[Reserve] = _refused if case == "refused" else wire.on.get(Reserve, _reserved(wire))
    wire.on_move = {"write": _write_fails, "cancelled": _write_cancelled}.get(case, wire.on_move)
    state = LayerState()
    msg = PushKV("r#0", SRC, DE, 64, dst_slots=SLOTS if case == "no grant" else [])
    done, p = push(wire, msg, state, attached=case != "detached")
    assert done == PushDone(ok=False, error=error, code=code)
    assert state.error == f"push failed: {error}"
    events = [e for e in _span(exporter).events if e.name == "exception"]
    assert [e.attributes["exception.message"] for e in events] == [error]
    assert [e.attributes["state"] for e in _span(exporter).events if e.name == "transfer"][-1] == "failed"


def _reserved(wire: Wire):
    async def reserve(msg):
        return Reserved(slots=SLOTS, grant=wire.given.give(msg.req_id, SLOTS, BN))
    return reserve


def test_a_layerwise_push_writes_each_layer_once_computed(spans):
    exporter, _ = spans
    wire = Wire()
    state = LayerState()
    wrote: list[tuple[int, int]] = []  # (layer written, layers computed by then)

    async def on_move(kind, ops):
        wrote.append(((ops[0].remote_offset // LB) % LAYERS, state.computed))
        asyncio.get_running_loop().call_soon(state.mark_computed, state.computed)
    wire.on_move = on_move
    state.mark_computed(0)
    window = KVWindow(2, [30], 2)
    msg = PushKV("r#0", [-1, -1, 8, 3], DE, 64, layerwise=True, window=window, skip=[3])
    done, p = push(wire, msg, state, before=lambda p: p.held.keep("r#0", DE, b""))
    assert done == PushDone(slots=SLOTS, nbytes=3 * BN, seconds=0.0)
    assert [layer for layer, _ in wrote] == list(range(LAYERS)) and all(c > layer for layer, c in wrote)
    assert state.pushed == LAYERS
    for layer, (_, _, ops, cls, timeout, _) in enumerate(wire.moved):
        ring = [30 * LAYERS + (layer % 2) * 2 + j for j in range(2)]  # hits 0, 1 in the window's ring
        assert ops == [Op("kv", lb * LB, "buf", SLOTS[i] + layer * LB, LB) for i, lb in
                       ((0, ring[0]), (1, ring[1]), (2, 8 * LAYERS + layer))]
        assert cls is TrafficClass.LATENCY and timeout == T
    assert [e.attributes["layer"] for e in _span(exporter).events if e.name == "layer_pushed"] == [0, LAYERS - 1]
    assert (sample(p, "push_layer_seconds_count"), sample(p, "push_layer_seconds_sum")) == (LAYERS, 0)
    assert sample(p, "push_layer_seconds_bucket", le="0.0001") == LAYERS  # buckets fine enough for one layer


def test_a_window_push_not_layerwise_writes_every_layer_at_once(spans):
    wire = Wire()
    state = LayerState()  # nothing computed: not waited for
    msg = PushKV("r#0", [-1, 8], DE, 32, window=KVWindow(1, [30], 2), dst_slots=SLOTS[:2])
    done, p = push(wire, msg, state, before=lambda p: p.held.keep("r#0", DE, wire.given.give("r#0", SLOTS, BN)))
    assert done.ok and state.pushed == LAYERS
    assert [[op.local_offset // LB for op in m[2]] for m in wire.moved] == [
        [30 * LAYERS + (layer % 2), 8 * LAYERS + layer] for layer in range(LAYERS)]


def test_a_layer_never_computed_fails_the_push_at_the_deadline(spans):
    wire = Wire()
    wire.on[Reserve] = _reserved(wire)
    done, _ = push(wire, PushKV("r#0", SRC, DE, 64, layerwise=True), LayerState(), timeout_s=0.05)
    assert done == PushDone(ok=False, error="layer 0 computed not within 0.05 s of the last progress",
                            code=ErrorCode.KV_TRANSFER)
    assert wire.moved == []


def test_metrics_are_named_and_described_for_the_dashboards():
    wire = Wire()
    p, region, _ = parts(wire, "t-pm")
    try:
        FetchPath(p)
        PushPath(p, None)
        text = p.metrics.render().decode()
    finally:
        region.close()
        region.unlink()
    assert "# HELP dualpath_traffic_manager_fetch_seconds Storage read time of a fetch\n" in text
    assert ("# HELP dualpath_traffic_manager_push_layer_seconds One layer of a layerwise push, on the data plane\n"
            in text)


def test_a_push_with_every_block_skipped_reaches_no_peer(spans):
    wire = Wire()
    done, p = push(wire, PushKV("r#0", SRC[:2], DE, 32, dst_slots=SLOTS[:2], skip=[0, 1]),
                   before=lambda p: p.held.keep("r#0", DE, wire.given.give("r#0", SLOTS, BN)))
    assert done == PushDone(slots=SLOTS[:2], seconds=0.0) and wire.reached == [] and wire.moved == []
