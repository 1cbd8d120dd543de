"""InFlight.accept: every token delivered exactly once, in order; timings from an injected clock."""
from __future__ import annotations

import asyncio
import types

import pytest

from services.scheduler import inflight as inflight_mod
from services.scheduler.inflight import InFlight
from shared.messages.codes import ErrorCode, FinishReason
from shared.messages.stream import TokenEvent
from shared.messages.work import Sampling

pytestmark = pytest.mark.unit


class Clock:
    def __init__(self, t: float = 100.0):
        self.t = t

    def __call__(self) -> float:
        return self.t


@pytest.fixture
def clock(monkeypatch):
    c = Clock()
    monkeypatch.setattr(inflight_mod, "time", types.SimpleNamespace(monotonic=c))
    return c


def rec(**kw) -> InFlight:
    kw.setdefault("arrived", 100.0)
    return InFlight("r1", [1, 2, 3], Sampling(max_tokens=8), **kw)


def ev(tokens, index, finish="", **kw) -> TokenEvent:
    return TokenEvent("r1", list(tokens), index, finish, **kw)


def test_in_order_events_are_delivered_unchanged(clock):
    r = rec()
    out = r.accept(ev([10, 11], 0, source="pe0", cached_tokens=64))
    assert out == ev([10, 11], 0, source="pe0", cached_tokens=64)
    assert r.accept(ev([12], 2)) == ev([12], 2)
    assert (r.tokens, r.next_index) == ([10, 11, 12], 3)


def test_exact_duplicate_is_dropped(clock):
    r = rec()
    r.accept(ev([10, 11], 0))
    assert r.accept(ev([10, 11], 0)) is None
    assert r.tokens == [10, 11] and r.next_index == 2


def test_gap_is_dropped_and_does_not_advance(clock):
    r = rec()
    r.accept(ev([10], 0))
    assert r.accept(ev([12], 2)) is None
    assert (r.tokens, r.next_index) == ([10], 1)
    assert r.accept(ev([11], 1)) == ev([11], 1)  # the missing one still fits afterwards


def test_gap_with_finish_does_not_finish(clock):
    r = rec()
    assert r.accept(ev([], 3, "stop")) is None
    assert r.finished is None


def test_partial_overlap_is_trimmed_to_new_tokens(clock):
    r = rec()
    r.accept(ev([10, 11, 12], 0))
    out = r.accept(ev([11, 12, 13, 14], 1, source="de0"))
    assert out == ev([13, 14], 3, source="de0")
    assert r.tokens == [10, 11, 12, 13, 14] and r.next_index == 5


def test_finish_is_recorded_and_delivered(clock):
    r = rec()
    r.accept(ev([10], 0))
    out = r.accept(ev([11], 1, "length"))
    assert out == ev([11], 1, "length") and r.finished == "length"


def test_finish_without_new_tokens_is_still_delivered(clock):
    r = rec()
    r.accept(ev([10, 11], 0))
    out = r.accept(ev([], 2, "stop"))
    assert out is not None and out.finish == "stop" and out.tokens == [] and out.index == 2


def test_duplicate_tokens_with_a_finish_deliver_only_the_finish_at_the_next_index(clock):
    r = rec()
    r.accept(ev([10, 11], 0))
    out = r.accept(ev([10, 11], 0, "stop"))
    assert (out.tokens, out.index, out.finish) == ([], 2, "stop")
    assert r.tokens == [10, 11]


def test_error_text_is_carried_through(clock):
    r = rec()
    out = r.accept(ev([], 0, "error", error="KV load failed"))
    assert (out.finish, out.error) == ("error", "KV load failed")


def test_events_after_finish_are_dropped(clock):
    r = rec()
    r.accept(ev([10], 0, "stop"))
    assert r.accept(ev([11], 1)) is None
    assert r.accept(ev([], 1, "error", error="late")) is None
    assert r.finished == "stop" and r.tokens == [10]


def test_empty_event_without_finish_is_not_delivered(clock):
    r = rec()
    assert r.accept(ev([], 0)) is None
    assert r.next_index == 0


def test_cached_tokens_are_kept_from_the_event_that_reports_them(clock):
    r = rec()
    r.accept(ev([10], 0, cached_tokens=128))
    r.accept(ev([11], 1))  # later events leave it at 0: not a reset
    assert r.cached_tokens == 128


def test_ttft_is_first_token_time_minus_arrival(clock):
    r = rec(arrived=100.0)
    assert r.ttft == 0.0  # no token yet
    clock.t = 100.25
    r.accept(ev([], 0))  # nothing delivered: no first token
    assert r.first_at == 0.0
    clock.t = 100.5
    r.accept(ev([10], 0))
    clock.t = 101.0
    r.accept(ev([11], 1))
    assert r.ttft == pytest.approx(0.5)


def test_tpot_is_mean_gap_between_tokens_after_the_first(clock):
    r = rec(arrived=100.0)
    clock.t = 101.0
    r.accept(ev([10], 0))
    assert r.tpot == 0.0  # one token: undefined, reported as 0
    clock.t = 101.2
    r.accept(ev([11, 12], 1))
    clock.t = 101.4
    r.accept(ev([13], 3, "stop"))
    assert r.tpot == pytest.approx((101.4 - 101.0) / 3)


def test_duplicates_do_not_move_the_last_token_time(clock):
    r = rec()
    clock.t = 101.0
    r.accept(ev([10, 11], 0))
    clock.t = 105.0
    r.accept(ev([10, 11], 0))
    assert r.last_at == 101.0


def test_fail_queues_an_error_event_and_finishes():
    async def scenario():
        r = rec()
        r.accept(ev([10, 11], 0))
        r.fail(ErrorCode.ENGINE_FAILED, "engine died")
        return r, await asyncio.wait_for(r.events.get(), 1)

    r, got = asyncio.run(scenario())
    assert got == TokenEvent("r1", [], 2, finish=FinishReason.ERROR, error="engine died", code=ErrorCode.ENGINE_FAILED)
    assert r.finished == "error"
    assert r.accept(ev([12], 2)) is None


def test_fail_after_finish_does_nothing():
    async def scenario():
        r = rec()
        r.accept(ev([10], 0, "stop"))
        r.fail(ErrorCode.INTERNAL, "too late")
        return r

    r = asyncio.run(scenario())
    assert r.finished == "stop" and r.events.empty()


def test_fail_twice_queues_one_error():
    async def scenario():
        r = rec()
        r.fail(ErrorCode.NO_ENGINE, "a")
        r.fail(ErrorCode.INTERNAL, "b")
        return r

    r = asyncio.run(scenario())
    assert r.events.qsize() == 1 and r.events.get_nowait().code is ErrorCode.NO_ENGINE
