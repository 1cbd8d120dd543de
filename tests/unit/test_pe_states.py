"""A request's states at the prefill engine (services/prefill_engine/life.py): only legal moves, by one
writer, each an event on its span; every state has a way out on cancel, failure and deadline, and
each ends with its blocks freed. The engine's service without a model (pe_util.py), over a
recording bus that answers pushes, admissions and saves."""
from __future__ import annotations

import ast
import asyncio
from pathlib import Path
from types import SimpleNamespace

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from services.prefill_engine import life as life_module
from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.life import ENDING, HELD, LEGAL, PeLife, PeState
from services.prefill_engine.metrics import PrefillMetrics
from services.prefill_engine.record import PrefillRequest
from shared.bus import BusError, Losses
from shared.messages.codes import ErrorCode
from shared.messages.traffic_manager import LayersLoaded, PushDone, PushKV, ReadFinished, Release, SaveCopied, SaveKV
from shared.messages.work import Ack, Cancel, DecodeAdmit, PrefillWork, Sampling
from shared.metrics import Metrics
from tests.unit.plan_util import pe_plan
from tests.unit.state_util import assert_illegal
from tests.unit.pe_util import bare_prefill, errors, finish_forward, intake, run
from tests.unit.test_engine_failures import BS, KV, LAYOUT

pytestmark = pytest.mark.unit
P = PeState
ROOT = Path(__file__).resolve().parents[2]
LIVE = [s for s in PeState if LEGAL[s]]


# --- the table -------------------------------------------------------------------------------------

def test_every_live_state_has_a_way_out_on_cancel_failure_and_deadline_and_only_released_ends():
    assert [s for s in PeState if not LEGAL[s]] == [P.RELEASED]
    for s in LIVE:
        if s in ENDING:  # answered, or its client left: only its release is left
            assert P.RELEASED in LEGAL[s] or P.CANCELLED in LEGAL[s], s
            continue
        assert P.FAILED in LEGAL[s], s  # a failure, and every deadline (a read's, a layer's, the hand-off's)
        assert (P.CANCELLING if s in HELD else P.CANCELLED) in LEGAL[s], s


def test_every_state_is_reached_and_every_one_reaches_released():
    reached, todo = {P.WAITING_BLOCKS, P.READY}, [P.WAITING_BLOCKS, P.READY]  # where intake puts a request
    while todo:
        for nxt in LEGAL[todo.pop()] - reached:
            reached.add(nxt)
            todo.append(nxt)
    assert reached == set(PeState)
    for s in PeState:
        seen, todo = {s}, [s]
        while todo:
            for nxt in LEGAL[todo.pop()] - seen:
                seen.add(nxt)
                todo.append(nxt)
        assert P.RELEASED in seen, s


def _req(rid: str = "r") -> PrefillRequest:
    return PrefillRequest(rid, [1, 2, 3], Sampling(), "out", None)


@pytest.mark.parametrize("path", [(P.COMPUTING,), (P.READING, P.COMPUTING), (P.CANCELLED, P.READY),
                                  (P.READY, P.COMPUTING, P.HANDING_OFF, P.READY), (P.FAILED, P.RELEASED, P.READY)])
def test_an_illegal_move_raises_is_counted_in_the_metric_and_changes_nothing(path):
    m = Metrics("prefill_engine")
    life, r = PeLife("pe0", PrefillMetrics(m, "pe0")), _req()
    life.enter(r, P.WAITING_BLOCKS)
    assert_illegal(life, r, path)
    assert m.registry.get_sample_value("dualpath_prefill_engine_illegal_transitions_total") == 1


def test_the_counts_and_the_gauges_follow_every_move():
    m = Metrics("prefill_engine")
    life, a, b = PeLife("pe0", PrefillMetrics(m, "pe0")), _req("a"), _req("b")

    def gauge(state):
        return m.registry.get_sample_value("dualpath_prefill_engine_requests_held", {"state": state})
    life.enter(a, P.WAITING_BLOCKS)
    life.enter(b, P.READY)
    assert (life.held(), life.waiting()) == (2, 2)
    assert m.registry.get_sample_value("dualpath_prefill_engine_queue_length") == 2
    life.move(a, P.READING)
    life.move(b, P.COMPUTING)
    assert (gauge("reading"), gauge("computing"), gauge("ready"), life.waiting()) == (1, 1, 0, 0)
    life.move(b, P.HANDING_OFF)
    life.move(b, P.RELEASED)
    assert life.held() == 1 and life.live()["handing_off"] == 0 and "released" not in life.live()
    assert m.registry.get_sample_value("dualpath_prefill_engine_queue_length") == 0


def test_each_move_is_an_event_on_the_requests_span(monkeypatch):
    spans = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(spans))
    monkeypatch.setattr(life_module, "tracer", provider.get_tracer("test"))
    life, r = PeLife("pe0"), _req()
    life.enter(r, P.READY, "nothing to load")
    for s, why in ((P.COMPUTING, "a forward"), (P.HANDING_OFF, "first token"), (P.RELEASED, "freed")):
        life.move(r, s, why)
    (span,) = spans.get_finished_spans()  # ended with the release
    assert span.name == "prefill_request" and span.attributes["req_id"] == "r"
    assert [(e.name, e.attributes["state"], e.attributes["why"]) for e in span.events] == [
        ("state", "ready", "nothing to load"), ("state", "computing", "a forward"),
        ("state", "handing_off", "first token"), ("state", "released", "freed")]


def test_only_pe_life_writes_a_requests_state():
    writers = []
    for path in sorted((ROOT / "services" / "prefill_engine").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(
                node, (ast.AugAssign, ast.AnnAssign)) else []
            for t in targets:
                for el in t.elts if isinstance(t, ast.Tuple) else [t]:
                    if isinstance(el, ast.Attribute) and el.attr == "state":
                        writers.append(f"{path.name}:{node.lineno}")
    assert writers == [], f"req.state written outside shared/states.py: {writers}"


# --- the engine: every state's way out ---------------------------------------------------------------

class Bus:
    """Records what is published and asked; answers pushes (once `gate` opens), admissions and saves."""

    def __init__(self):
        self.losses = Losses()  # the real bus's: engines keep a request's connection
        self.sent: list[tuple[str, object]] = []
        self.gate = asyncio.Event()
        self.gate.set()
        self.admit_gate = asyncio.Event()  # cleared: the DE never replies (killed after taking the admission)
        self.admit_gate.set()

    async def publish(self, subject, msg, ctx=None):
        self.sent.append((subject, msg))

    async def request(self, subject, msg, timeout=5.0, ctx=None, abort=None):
        self.sent.append((subject, msg))
        if isinstance(msg, PushKV):
            await self.gate.wait()
            return PushDone(slots=list(range(len(msg.src_blocks))))
        if isinstance(msg, DecodeAdmit):
            waits = [asyncio.ensure_future(self.admit_gate.wait())] + ([abort] if abort is not None else [])
            await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
            if not self.admit_gate.is_set():
                waits[0].cancel()
                raise BusError(subject, "the responder went away before its reply")
            return Ack()
        if isinstance(msg, SaveKV):
            return SaveCopied(len(msg.blocks))
        raise AssertionError(f"no reply scripted for {msg}")


def engine(tg, timeout: float = 600.0, kv_blocks: int = 32, estimate: float = 0.0, window: int = 0):
    kv = KV(kv_blocks)
    kv.layout = lambda: None
    cfg = PrefillEngineConfig(handoff_timeout_s=timeout, block_size=BS, hit_window_layers=window, engine="pe0")
    svc = bare_prefill(Bus(), kv, LAYOUT, cfg, tasks=tg)
    svc.s_per_token = estimate / 5  # `work`'s prompts compute 5 tokens: `estimate` seconds
    return svc


def work(rid: str = "r1", hits: int = 3) -> PrefillWork:
    prompt = list(range(hits * BS + 5))
    return PrefillWork(rid, prompt, Sampling(), "de0", "out", block_keys=[bytes([i]) * 16 for i in range(hits)],
                       plan=pe_plan(hits, "pe0"))


async def until(pred) -> None:
    """Poll `pred()` until it holds (a deadline of the engine's has to pass first)."""
    while not pred():
        await asyncio.sleep(0.005)


async def settle():
    for _ in range(20):
        await asyncio.sleep(0)


def ended(svc, req, *, errors_sent: int = 0) -> None:
    """It is released, its blocks free, nothing illegal happened on the way."""
    assert req.state is P.RELEASED and not svc.held and svc.life.held() == 0
    assert svc.kv.alloc.free == svc.kv.alloc.n_slots and svc.life.illegal == 0 and not svc.queue
    assert len(errors(svc.bus.sent)) == errors_sent


async def _to(svc, state: PeState, tg) -> PrefillRequest:
    """A request brought to `state` the way the engine brings it there."""
    hits = 0 if state is P.HANDING_OFF else 3
    req = await intake(svc, work(hits=hits))
    if state in (P.WAITING_BLOCKS, P.READING):
        return req
    if hits:
        await svc._on_loaded(ReadFinished("r1", 3, eta_s=0.5 if state is P.LOADING else 0.0), None)
    if state in (P.LOADING, P.READY):
        return req
    svc.move(req, P.COMPUTING, "the test's forward")
    if state is P.HANDING_OFF:
        assert svc._allocate(req)
        svc.bus.gate.clear()  # its push waits
        finish_forward(svc, req, 7)
        await settle()
    return req


@pytest.mark.parametrize("state", [P.WAITING_BLOCKS, P.READING, P.LOADING, P.READY, P.COMPUTING, P.HANDING_OFF])
def test_a_cancel_in_any_state_ends_the_request_and_frees_its_blocks_once_nothing_uses_them(state):
    async def go(tg):
        svc = engine(tg, kv_blocks=3 if state is P.WAITING_BLOCKS else 32, estimate=0.1)
        req = await _to(svc, state, tg)
        assert req.state is state
        await svc._on_cancel(Cancel("r1"), SimpleNamespace(ctx=None))
        assert req.state is {P.WAITING_BLOCKS: P.RELEASED, P.COMPUTING: P.CANCELLING,  # no blocks yet: freed now
                             P.HANDING_OFF: P.CANCELLING}.get(state, P.CANCELLED)
        if state is P.READING:  # the read lands, then its layers: freed with the last one
            await svc._on_loaded(ReadFinished("r1", 3), None)
            assert req.state is P.CANCELLED and req.blocks
        if state in (P.READING, P.LOADING, P.READY, P.COMPUTING):  # its last layer lands
            await svc._on_loaded(LayersLoaded("r1", LAYOUT.n_layers - 1), None)
        if state is P.COMPUTING:
            assert req.state is P.CANCELLING and req.blocks  # the forward still computes into its blocks
            finish_forward(svc, req, None)  # its forward ends: no first token
        if state is P.HANDING_OFF:
            svc.bus.gate.set()
            await settle()
        ended(svc, req)
    run(go)


def test_a_cancel_while_the_hand_off_waits_on_a_killed_decode_engine_ends_it_at_once():
    async def go(tg):
        svc = engine(tg)  # the hand-off's own deadline (600 s) never passes here
        req = await _to(svc, P.HANDING_OFF, tg)
        svc.bus.admit_gate.clear()  # the DE took the admission and died: no reply ever comes
        svc.bus.gate.set()
        await until(lambda: any(isinstance(m, DecodeAdmit) for _, m in svc.bus.sent))
        await svc._on_cancel(Cancel("r1"), SimpleNamespace(ctx=None))  # the scheduler resumed it elsewhere
        await until(lambda: req.state is P.RELEASED)
        ended(svc, req)
        assert any(isinstance(m, Release) and "de0" in sub for sub, m in svc.bus.sent), "DE slots kept"
    run(go)


def test_a_cancel_after_the_forward_sampled_its_first_token_ends_it_in_its_hand_off():
    async def go(tg):
        svc = engine(tg)
        req = await intake(svc, work())
        await svc._on_loaded(ReadFinished("r1", 1), None)  # one of three stored blocks found: two computed
        await svc._on_loaded(LayersLoaded("r1", LAYOUT.n_layers - 1), None)
        svc.move(req, P.COMPUTING, "the test's forward")
        await svc._on_cancel(Cancel("r1"), SimpleNamespace(ctx=None))
        finish_forward(svc, req, 7)  # the forward was over: its hand-off stores the prompt and frees it
        await settle()
        ended(svc, req)
        assert [m for _, m in svc.bus.sent if isinstance(m, SaveKV)], "a cancelled prompt not persisted"
    run(go)


def test_a_read_that_never_reports_fails_at_its_deadline_and_is_freed_one_deadline_later():
    async def go(tg):
        svc = engine(tg, timeout=0.05)
        req = await intake(svc, work())
        await until(lambda: errors(svc.bus.sent))  # answered at its deadline
        assert req.state is P.FAILED and req.blocks  # answered; a late copy may still land: not freed yet
        (ev,) = errors(svc.bus.sent)
        assert ev.code is ErrorCode.STORAGE and ev.retryable
        await until(lambda: req.state is P.RELEASED)
        ended(svc, req, errors_sent=1)
    run(go)


@pytest.mark.parametrize("cancelled", [False, True])
def test_a_traffic_manager_restart_ends_a_read_in_flight_at_once(cancelled):
    async def go(tg):
        svc = engine(tg)
        req = await intake(svc, work())
        if cancelled:
            await svc._on_cancel(Cancel("r1"), SimpleNamespace(ctx=None))
        await svc.tm_restarted()
        ended(svc, req, errors_sent=0 if cancelled else 1)
    run(go)


def test_a_short_read_without_kv_memory_for_the_rest_is_abandoned_and_freed_with_its_last_copy():
    async def go(tg):
        svc = engine(tg, window=2)  # 3 hits two layers at a time: a ring of 2 blocks, and 1 for the rest
        req = await intake(svc, work(hits=3))
        assert req.window is not None
        others = svc.kv.alloc.allocate("other", svc.kv.alloc.free)  # nothing left for the misses
        await svc._on_loaded(ReadFinished("r1", 1), None)
        assert req.state is P.FAILED and errors(svc.bus.sent)[0].code is ErrorCode.BUFFER_FULL
        await svc._on_loaded(LayersLoaded("r1", LAYOUT.n_layers - 1), None)
        svc.kv.alloc.release_slots("other", others)
        ended(svc, req, errors_sent=1)
    run(go)


def test_the_announcement_counts_the_requests_held_from_their_states():
    async def go(tg):
        svc = engine(tg, kv_blocks=3)
        waiting = await intake(svc, work("a"))  # 4 blocks needed, 3 free: waits for KV blocks
        ready = await intake(svc, work("b", hits=0))
        assert (waiting.state, ready.state) == (P.WAITING_BLOCKS, P.READY)
        assert svc.announce().seq == 2 and svc.life.waiting() == 2
        await svc._on_cancel(Cancel("a"), SimpleNamespace(ctx=None))
        assert svc.announce().seq == 1 and svc.metrics.registry.get_sample_value(
            "dualpath_prefill_engine_queue_length") == 1
    run(go)


@pytest.mark.parametrize("state", [P.READING, P.READY, P.WAITING_BLOCKS])
def test_after_a_nats_reconnect_an_attempt_held_from_before_ends_with_a_retryable_error(state):
    """Its Cancel may have been lost while the connection was down (the scheduler resumed it)."""
    async def go(tg):
        svc = engine(tg, kv_blocks=3 if state is P.WAITING_BLOCKS else 32)
        req = await _to(svc, state, tg)
        svc.bus.losses.lost()  # the connection it came on drops
        later = await intake(svc, work("r2", hits=0)) if state is P.WAITING_BLOCKS else None
        svc._reconnected()
        await settle()
        if state is not P.WAITING_BLOCKS:
            await until(lambda: req.state is P.RELEASED or req.state is P.FAILED)
            if req.state is P.FAILED:  # a layer copy may still land: freed with the last one
                await svc._on_loaded(LayersLoaded("r1", LAYOUT.n_layers - 1), None)
        (ev,) = errors(svc.bus.sent)
        assert ev.req_id == "r1" and ev.retryable and ev.code is ErrorCode.ENGINE_FAILED
        if later is None:
            ended(svc, req, errors_sent=1)
        else:  # the one that arrived after the reconnect goes on
            assert req.state is P.RELEASED and later.state not in ENDING and svc.held == {"r2": later}
    run(go)
