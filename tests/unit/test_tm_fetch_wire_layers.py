"""When a fetch tells the engine which layers are in KV memory (`LayersLoaded`, fetch_wire.py): layers
copied close together in one message, a layer that took its time the moment it landed, and what
is in place always before the fetch waits (an engine reusing window slots waits on it); a hit
window's slot is reused only once the push took its layer on."""
from __future__ import annotations

import asyncio

import pytest

from services.traffic_manager import fetch as fetch_module
from shared.messages.storage_gateway import ReadBlocks, ReadDone
from shared.messages.traffic_manager import FetchFailed, FetchKV, KVWindow, LayersLoaded
from tests.unit.fetch_wire import LAYERS, LAYOUT, LB, PE_NODE, Clock, Wire
from tests.unit.test_tm_fetch_wire import KEYS, run, spans, split  # noqa: F401 - the fixture

pytestmark = pytest.mark.unit
TURNS = 20  # event-loop turns a lagging gateway takes to stream its next layer


class Gateway:
    """The PE path's read of every block: `start` layers in `first` turns after it opened; each
    `LayersLoaded(l)` heard brings layers up to `upto(l)`, `lag` turns later; the verdict once
    `LayersLoaded(verdict_at)` was heard (None: once every layer is in)."""

    def __init__(self, wire: Wire, start: int, first: int, upto, lag: int, verdict_at: int | None):
        self.wire, self.start, self.first, self.upto, self.lag = wire, start, first, upto, lag
        self.verdict_at = verdict_at
        self.track, self.verdict = None, asyncio.Event()
        wire.on[ReadBlocks], wire.on_publish = self.read, self.heard

    async def read(self, msg: ReadBlocks) -> ReadDone:
        self.track = self.wire.parts.reads.get((msg.req_id, "pe"))
        self.track.opened = len(msg.block_keys)
        await self._bring(self.start, self.first)
        await self.verdict.wait()
        return ReadDone(blocks=len(msg.block_keys))

    async def heard(self, msg) -> None:
        if isinstance(msg, LayersLoaded):
            if msg.layer == self.verdict_at:
                self.verdict.set()
            asyncio.ensure_future(self._bring(self.upto(msg.layer), self.lag))
        elif isinstance(msg, FetchFailed):
            self.verdict.set()

    async def _bring(self, layers: int, turns: int) -> None:
        for _ in range(turns):
            await asyncio.sleep(0)
        self.track.layers = max(self.track.layers, layers)
        if self.track.layers >= LAYERS and self.verdict_at is None:
            self.verdict.set()
        self.track.note()


ALL = lambda layer: LAYERS  # noqa: E731
NEXT = lambda layer: layer + 2  # noqa: E731


@pytest.mark.parametrize("step, gap, gateway, loaded", [
    (0, None, (1, TURNS, ALL, 0, LAYERS - 2), [0, 2, 3]),  # told before each wait: layer 0, then all but the last
    (1, 1.0, (LAYERS, 0, ALL, 0, None), [0, 1, 2, 3]),  # each layer a gap after the last message: one each
    (1, 2.0, (LAYERS, 0, ALL, 0, 2), [1, 2, 3]),  # every other layer; the last waits for the verdict
    (1, 1.0, (1, 0, NEXT, TURNS, None), [0, 1, 2, 3]),  # a lagging read: each told once, when it landed
    (0, None, (LAYERS, 0, ALL, 0, None), [3]),  # all at once: one message
])
def test_layers_loaded_tells_each_layer_once_and_before_every_wait(spans, monkeypatch, step, gap, gateway, loaded):
    monkeypatch.setattr(fetch_module, "time", Clock(step))
    if gap is not None:
        monkeypatch.setattr(fetch_module, "LAYER_NOTIFY_GAP_S", gap)
    wire = Wire()
    Gateway(wire, *gateway)
    p, _ = run(wire, FetchKV("r#0", KEYS, [6, 1, 8, 3, 12], PE_NODE, LAYOUT, pe_blocks=5))
    assert not wire.of(FetchFailed)
    assert [m.layer for m in wire.of(LayersLoaded)] == loaded
    assert {s for s, m in wire.heard if isinstance(m, LayersLoaded)} == {p.loaded_subject}


def test_a_window_slot_is_refilled_only_after_the_push_took_its_layer_on(spans):
    wire = Wire()
    seen: list[tuple[int, int]] = []  # (layer copied, layers pushed on by then)

    async def on_move(kind, ops):
        seen.append(((ops[0].remote_offset // LB) % LAYERS, state().pushed))

    def state():
        return wire.parts.layers.items["r#0"]

    async def push_later(layer: int) -> None:
        for _ in range(TURNS):
            await asyncio.sleep(0)
        state().pushed = max(state().pushed, layer + 1)
        state().note()

    async def heard(msg):
        if isinstance(msg, LayersLoaded) and msg.layer < LAYERS - 1:
            asyncio.ensure_future(push_later(msg.layer - 1))  # the engine's push is a layer behind
    wire.on_move, wire.on_publish = on_move, heard
    p, _ = run(wire, split(window=KVWindow(5, [30, 31, 32], 2)))
    assert not wire.of(FetchFailed)
    assert sorted({layer for layer, _ in seen}) == list(range(LAYERS))
    assert all(pushed > layer - 2 for layer, pushed in seen), seen  # layer l reuses layer l - 2's slots
    assert [m.layer for m in wire.of(LayersLoaded)] == [1, 2, 3]
    assert p.layers.items == {}
