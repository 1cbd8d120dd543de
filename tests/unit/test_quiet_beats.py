"""An idle or steadily decoding service wakes little: an unchanged announcement goes out only as a
keepalive every `quiet_beats + 1` beats (a change at the next beat), an engine's token count that
moves every step is no change, and the HTTP server's tick no longer polls for its stop."""
from __future__ import annotations

import asyncio
from types import SimpleNamespace

import msgspec
import pytest
from starlette.applications import Starlette

from shared.engine.service import EngineService
from shared.http import HttpServer
from shared.messages.registry import EngineAnnounce, StorageGatewayAnnounce
from shared.runtime import Beats, Service, _heartbeat

pytestmark = pytest.mark.unit


def test_an_unchanged_announcement_goes_out_every_quiet_plus_one_beats_a_change_at_once():
    beats = Beats(quiet=2)
    sent = [beats.due(key) for key in "aaaaaaab" + "bc"]
    assert sent == [True, False, False, True, False, False, True, True, False, True]
    assert all(Beats(quiet=0).due("a") for _ in range(5))  # 0: every beat announces


class _Bus:
    def __init__(self, stop: asyncio.Event, n: int):
        self.stop, self.n, self.sent = stop, n, []

    async def publish(self, subject, msg):
        self.sent.append(msg)


class _Svc:
    """Announces a gateway whose read queue is 0 except on the beats listed in `busy`."""

    def __init__(self, quiet: int, busy: set[int], beats: int):
        self.cfg = SimpleNamespace(heartbeat_s=0.0, quiet_beats=quiet)
        self.heartbeat_subject = "t.hb"
        self.stop = asyncio.Event()
        self.bus = _Bus(self.stop, beats)
        self.busy, self.beats, self.calls = busy, beats, 0
        self.beat_key = Service.beat_key.__get__(self)

    def announce(self):
        self.calls += 1
        if self.calls >= self.beats:
            self.stop.set()  # this beat is the last
        return StorageGatewayAnnounce("gw", "n0", read_q_blocks=int(self.calls in self.busy))


def test_the_heartbeat_loop_sends_changes_and_keepalives_only():
    svc = _Svc(quiet=1, busy={4}, beats=8)
    asyncio.run(_heartbeat(svc, svc.stop))
    # beats 1..8, the read queue 1 on beat 4 only: 1 (new), 3 (keepalive), 4 (changed), 5 (changed back), 7
    assert [m.read_q_blocks for m in svc.bus.sent] == [0, 0, 1, 0, 0]
    svc = _Svc(quiet=0, busy=set(), beats=6)
    asyncio.run(_heartbeat(svc, svc.stop))
    assert len(svc.bus.sent) == 6


def test_an_engines_token_count_is_no_change_but_its_free_blocks_are():
    a = EngineAnnounce("i", "n0", engine="e0", seq=2, tok=300, free_blocks=10)
    key = EngineService.beat_key
    assert key(None, a) == key(None, msgspec.structs.replace(a, tok=308))  # one decode step later
    assert key(None, a) != key(None, msgspec.structs.replace(a, free_blocks=9))
    assert key(None, a) != key(None, msgspec.structs.replace(a, seq=1))


def test_the_http_servers_stop_wakes_its_tick_at_once(monkeypatch):
    """With a tick of an hour, only stop() waking it lets serve() return."""
    monkeypatch.setattr("shared.http._Server.TICK_S", 3600.0)
    ticks = []

    async def run():
        http = HttpServer(Starlette())
        on_tick = http.server.on_tick

        async def counted(counter):
            ticks.append(counter)
            return await on_tick(counter)
        http.server.on_tick = counted
        serving = asyncio.ensure_future(http.serve())
        while not ticks:  # started: the first tick ran
            await asyncio.sleep(0)
        http.stop()
        await asyncio.wait_for(serving, 60)  # a hang guard, not a time bound

    asyncio.run(run())
    assert ticks[0] == 0 and all(t % 10 == 0 for t in ticks)  # every tick refreshes the Date header
