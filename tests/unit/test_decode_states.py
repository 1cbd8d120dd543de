"""A decode engine's requests by state (services/decode_engine/states.py): only legal moves, every live
state with a way out on failure, cancel and deadline, and the announcement and metrics read from the
counts. Drives the real service's admission, load, batch and release paths with a recording bus."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import pytest

from services.decode_engine.app import DecodeEngineService
from services.decode_engine.config import DecodeEngineConfig
from services.decode_engine.running import DecodeRequest
from services.decode_engine.states import LEGAL, LIVE, TERMINAL, DeState
from shared.bus import Losses
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.stream import TokenEvent
from shared.messages.traffic_manager import Release
from shared.messages.work import DecodeAdmit, Sampling

pytestmark = pytest.mark.unit
S = DeState


class Bus:
    def __init__(self):
        self.losses = Losses()  # the real bus's: engines keep a request's connection
        self.sent: list[tuple[str, object]] = []

    async def publish(self, subject, msg, ctx=None):
        self.sent.append((subject, msg))


def engine(**cfg) -> DecodeEngineService:
    svc = DecodeEngineService(DecodeEngineConfig(engine="de-t", kv_blocks=8, block_size=16, **cfg))
    svc.bus = Bus()
    svc.loaded = SimpleNamespace(model_id="m", config=SimpleNamespace(max_position=1 << 12, eos_ids=()))
    svc.spawn = lambda coro, name=None, **_: asyncio.ensure_future(coro)
    return svc


def request(rid: str = "d1") -> DecodeRequest:
    admit = DecodeAdmit(rid, 20, 7, Sampling(max_tokens=4), "out", [], persist=False)
    return DecodeRequest(rid, list(range(20)), admit.sampling, "out", None, admit=admit, generated=[7])


def run(test):
    async def go():
        svc = engine()
        try:
            await test(svc)
        finally:
            svc.worker.close()
    asyncio.run(go())


def test_every_live_state_has_a_way_out_on_failure_and_on_cancel():
    for s in LIVE:
        assert S.FAILED in LEGAL[s], s
        assert S.CANCELLED in LEGAL[s] or S.STOPPING in LEGAL[s], s
    assert S.CANCELLED in LEGAL[S.STOPPING]
    assert all(not LEGAL[s] for s in TERMINAL)


def test_a_request_goes_admitted_loading_running_done_and_the_announcement_follows():
    async def go(svc):
        req = request()
        svc._hold(req)
        assert req.state is S.ADMITTED and svc.life.live()["admitted"] == 1
        assert (svc.announce().seq, svc.announce().tok) == (1, 21) and req.timer is not None
        svc._loading(req, [0, 1])
        assert req.state is S.LOADING and req.timer is None
        await svc._load(req)  # oracle: nothing to copy
        assert req.state is S.RUNNING and svc.ready and svc.life.counts[S.RUNNING] == 1
        seq = svc.ready.pop()
        svc.running.append(seq)
        for tok in (1, 2, 3):
            svc._advance(seq, tok, None, 1, 0.0)
        assert req.state is S.DONE and not svc.held and not svc.running
        assert svc.announce().seq == 0 and sum(svc.life.counts.values()) == 0 and svc.life.illegal == 0
    run(go)


def test_a_cancel_while_admitted_frees_its_tm_slots_at_once():
    async def go(svc):
        req = request()
        svc._hold(req)
        await svc._on_cancel(SimpleNamespace(req_id="d1", reason="client left"), None)
        assert req.state is S.CANCELLED and not svc.waiting and not svc.held and req.timer is None
        assert [m for _, m in svc.bus.sent] == [Release("d1")]
    run(go)


def test_a_cancel_while_loading_waits_for_the_load_then_releases():
    async def go(svc):
        req = request()
        svc._hold(req)
        svc._loading(req, [0, 1])
        await svc._on_cancel(SimpleNamespace(req_id="d1", reason="client left"), None)
        assert req.state is S.STOPPING and req.ending is S.CANCELLED and "d1" in svc.held
        await svc._load(req)
        assert req.state is S.CANCELLED and not svc.ready and not svc.held
    run(go)


def test_a_running_request_whose_save_failed_stops_and_a_later_cancel_wins():
    async def go(svc):
        req = request()
        svc._hold(req)
        svc._loading(req, [0, 1])
        await svc._load(req)
        svc._background_failed(req, "persisting its KV failed")
        assert req.state is S.STOPPING and req.ending is S.FAILED
        await svc._on_cancel(SimpleNamespace(req_id="d1", reason="client left"), None)
        assert req.ending is S.CANCELLED
        svc.running += svc.ready
        await svc._leave(svc.running[0])
        assert req.state is S.CANCELLED and not [m for _, m in svc.bus.sent if isinstance(m, TokenEvent)]
    run(go)


def test_a_request_whose_saves_are_in_flight_persists_then_ends_as_it_finished():
    async def go(svc):
        req = request()
        svc._hold(req)
        svc._loading(req, [0, 1])
        await svc._load(req)
        svc.persister = SimpleNamespace(busy=lambda rid: True, release_later=lambda r: None)
        svc._release(req, S.DONE, "stop")
        assert req.state is S.PERSISTING and "d1" in svc.held and svc.announce().seq == 1
        svc.persister = None
        svc._release(req)  # its saves were copied out
        assert req.state is S.DONE and not svc.held
    run(go)


def test_an_admitted_request_past_its_deadline_fails_retryable_and_frees_its_tm_slots():
    async def go():
        svc = engine(admit_wait_s=0.02)
        try:
            req = request()
            svc._hold(req)
            while not any(isinstance(m, TokenEvent) for _, m in svc.bus.sent):
                await asyncio.sleep(0.005)  # a poll: its admission deadline has to pass
            events = [m for _, m in svc.bus.sent if isinstance(m, TokenEvent)]
            assert Release("d1") in [m for _, m in svc.bus.sent]
            assert len(events) == 1 and events[0].finish is FinishReason.ERROR and events[0].retryable
            assert events[0].code is ErrorCode.NO_ENGINE
            assert req.state is S.FAILED and not svc.waiting and not svc.held
        finally:
            svc.worker.close()
    asyncio.run(go())


def test_an_illegal_move_is_refused_counted_and_shown():
    async def go(svc):
        req = request()
        svc._hold(req)
        assert not svc.life.try_move(req, S.PERSISTING)
        assert req.state is S.ADMITTED and svc.life.illegal == 1
        text = svc.metrics.render().decode()
        assert "dualpath_decode_engine_illegal_transitions_total 1.0" in text
        assert 'dualpath_decode_engine_requests{state="admitted"} 1.0' in text
    run(go)


def test_after_a_nats_reconnect_a_request_held_from_before_ends_and_its_scheduler_hears_it_retryable():
    async def go(svc):
        old = request("d1")
        old.connection = svc.bus.losses.current()
        svc._hold(old)
        svc._loading(old, [0, 1])
        await svc._load(old)  # running
        svc.bus.losses.lost()  # the connection it came on drops
        new = request("d2")
        new.connection = svc.bus.losses.current()  # admitted after the reconnect
        svc._hold(new)
        svc._reconnected()
        for _ in range(20):
            await asyncio.sleep(0)
        assert old.state is S.STOPPING and old.ending is S.CANCELLED and new.state is S.ADMITTED
        (ev,) = [m for _, m in svc.bus.sent if isinstance(m, TokenEvent)]
        assert ev.req_id == "d1" and ev.retryable and ev.code is ErrorCode.ENGINE_FAILED
    run(go)
