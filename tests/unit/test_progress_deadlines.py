"""Deadlines on the layerwise path count from the last progress, not from the wait's start: a slow
but moving forward (an overloaded machine) fails nothing, a peer gone silent is still given up on.

Traffic-manager side (progress.py): a push waiting for a layer to be computed, or a fetch whose
hit window waits for a layer to be pushed, restarts its deadline at every change of the
request's `LayerState` -- a layer computed, a layer pushed, or the engine's keep-alive
(`ForwardAlive`, sent every quarter deadline while the forward runs). Engine side
(layers.py): a forward waiting for a stored layer restarts its deadline at every layer landed,
and never gives up before the read's expected end (`ReadFinished.eta_s`).
"""
from __future__ import annotations

import asyncio
import threading
import time

import pytest

from services.prefill_engine.config import PrefillEngineConfig
from services.prefill_engine.handoff import Handoff
from services.prefill_engine.layers import LoadError, LoadProgress
from services.prefill_engine.link import PeLink
from services.traffic_manager.progress import LayerState
from shared.messages.endpoints import EP
from shared.messages.subjects import Subjects
from shared.messages.traffic_manager import ForwardAlive

pytestmark = pytest.mark.unit
TIMEOUT = 0.2  # seconds without progress before a wait gives up


def test_a_slow_forward_that_keeps_computing_outlives_many_deadlines():
    """Ten layers, each computed a half deadline after the last: 2.5 deadlines in all, never one
    without progress. (A deadline from the wait's start fails this at the first 0.2 s.)"""
    async def main():
        state = LayerState()

        async def forward():
            for layer in range(10):
                await asyncio.sleep(TIMEOUT / 2)
                state.computed = layer + 1
                state.note()
        task = asyncio.create_task(forward())
        await state.until(lambda: state.computed >= 10, TIMEOUT, "layer 9 computed")
        await task
        return state.computed
    assert asyncio.run(main()) == 10


def test_keep_alives_alone_hold_a_wait_open_while_the_forward_waits_elsewhere():
    """The forward computes nothing for a while (it waits for another request's read) but its engine
    keeps saying it is alive: the push's wait outlives its deadline, then the layer comes."""
    async def main():
        state = LayerState()

        async def engine():
            for _ in range(6):  # 6 keep-alives, a third of a deadline apart: 2 deadlines of no layer
                await asyncio.sleep(TIMEOUT / 3)
                state.note()  # what the TM does with ForwardAlive
            state.computed = 1
            state.note()
        task = asyncio.create_task(engine())
        t0 = time.monotonic()
        await state.until(lambda: state.computed > 0, TIMEOUT, "layer 0 computed")
        await task
        return time.monotonic() - t0
    assert asyncio.run(main()) > TIMEOUT  # it did wait past one deadline, and did not fail


def test_a_silent_peer_is_still_given_up_on():
    """One layer, then nothing (the engine died): the wait fails a deadline after that last layer."""
    async def main():
        state = LayerState()

        async def engine():
            await asyncio.sleep(TIMEOUT / 2)
            state.computed = 1
            state.note()
        task = asyncio.create_task(engine())
        with pytest.raises(LookupError, match="layer 1 computed not within 0.2 s of the last progress"):
            await state.until(lambda: state.computed > 1, TIMEOUT, "layer 1 computed")
        await task
        return state.moved
    moved = asyncio.run(main())
    assert moved > 0


def test_a_failed_state_ends_the_wait_at_once():
    async def main():
        state = LayerState()
        asyncio.get_running_loop().call_later(0.01, state.fail, "push failed: peer gone")
        with pytest.raises(RuntimeError, match="peer gone"):
            await state.until(lambda: state.pushed > 0, 60.0, "layer 0 pushed on")
    asyncio.run(main())


def _land(load: LoadProgress, layers: int, every_s: float) -> threading.Thread:
    def run():
        for layer in range(layers):
            time.sleep(every_s)
            load.mark(layer)
    t = threading.Thread(target=run)
    t.start()
    return t


def test_the_engine_waits_for_a_slow_load_while_its_layers_keep_landing():
    load = LoadProgress("r")
    t = _land(load, 8, TIMEOUT / 2)  # 0.8 s for 8 layers, 0.1 s apart
    load.wait(7, TIMEOUT)
    t.join()
    assert load.layers == 8


def test_the_reads_expected_end_holds_the_wait_open():
    """Nothing lands for 3 deadlines, but the read said it ends in 4: the wait goes on until then."""
    load = LoadProgress("r")
    load.expect(4 * TIMEOUT)
    threading.Timer(3 * TIMEOUT, load.mark, (0,)).start()
    load.wait(0, TIMEOUT)
    assert load.layers == 1


def test_the_engine_gives_up_on_a_load_that_stopped():
    load = LoadProgress("r")
    t = _land(load, 2, TIMEOUT / 4)  # two layers, then the traffic-manager goes silent
    with pytest.raises(LoadError, match="layer 5: not loaded within 0.2s of the last progress"):
        load.wait(5, TIMEOUT)
    t.join()
    assert load.layers == 2


class _Bus:
    def __init__(self):
        self.sent: list[tuple[str, object]] = []
        self.changed = asyncio.Event()

    async def publish(self, subject, msg, ctx=None):
        self.sent.append((subject, msg))
        self.changed.set()


def test_a_running_forward_sends_keep_alives_to_its_traffic_manager():
    async def main():
        bus = _Bus()
        h = Handoff(PeLink(bus, Subjects("t"), "pe-1", None), PrefillEngineConfig(handoff_timeout_s=0.04, node="n"),
                    None, ())

        class Req:
            req_id = "r#0"
        task = asyncio.create_task(h.keepalive([Req()]))
        while len(bus.sent) < 3:  # a beat every 0.01 s (a quarter of the deadline)
            bus.changed.clear()
            await bus.changed.wait()
        task.cancel()
        return bus.sent
    sent = asyncio.run(main())
    assert {s for s, _ in sent} == {Subjects("t").at(EP.TM_ALIVE, engine="pe-1")}
    assert all(isinstance(m, ForwardAlive) and m.req_ids == ["r#0"] for _, m in sent)
