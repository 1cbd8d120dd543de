"""A request's states at the scheduler: only legal moves, one writer, counts that /health and metrics share."""
from __future__ import annotations

import pytest

from services.scheduler.inflight import InFlight
from services.scheduler.lifecycle import LEGAL, TERMINAL, IllegalTransition, Lifecycle, ReqState
from shared.messages.work import Sampling
from tests.unit.state_util import assert_illegal

pytestmark = pytest.mark.unit


def rec(rid: str = "r") -> InFlight:
    return InFlight(rid, [1, 2, 3], Sampling(max_tokens=4))


def test_a_request_goes_queued_prefilling_decoding_done_and_the_counts_follow():
    life, r = Lifecycle(), rec()
    life.enter(r)
    assert (r.state, life.waiting(), life.running()) == (ReqState.QUEUED, 1, 0)
    life.move(r, ReqState.PREFILLING)
    assert (life.waiting(), life.running()) == (0, 1)
    life.move(r, ReqState.DECODING)
    assert life.live() == {"queued": 0, "prefilling": 0, "decoding": 1, "resuming": 0}
    life.end(r, "ok")
    assert (r.state, life.waiting(), life.running()) == (ReqState.DONE, 0, 0)
    life.end(r, "cancelled")  # a second end changes nothing
    assert r.state == ReqState.DONE and life.illegal == 0


def test_a_resumed_request_goes_back_to_the_queue():
    life, r = Lifecycle(), rec()
    life.enter(r)
    for s in (ReqState.PREFILLING, ReqState.DECODING, ReqState.RESUMING, ReqState.QUEUED):
        life.move(r, s)
    assert (life.waiting(), life.running()) == (1, 0)


@pytest.mark.parametrize("status,state", [("ok", ReqState.DONE), ("error", ReqState.FAILED),
                                          ("cancelled", ReqState.CANCELLED), ("odd", ReqState.FAILED)])
def test_every_live_state_has_a_way_out_for_each_ending(status, state):
    for live in (s for s in LEGAL if s not in TERMINAL):
        assert state in LEGAL[live]
    life, r = Lifecycle(), rec()
    life.enter(r)
    life.end(r, status)
    assert r.state == state and sum(life.counts.values()) == 0


@pytest.mark.parametrize("path", [(ReqState.DECODING,), (ReqState.PREFILLING, ReqState.QUEUED),
                                  (ReqState.PREFILLING, ReqState.DECODING, ReqState.PREFILLING)])
def test_an_illegal_move_raises_with_its_fields_is_counted_and_changes_nothing(path):
    life, r = Lifecycle(), rec()
    life.enter(r)
    assert_illegal(life, r, path)


def test_a_finished_request_cannot_move_again():
    life, r = Lifecycle(), rec()
    life.enter(r)
    life.end(r, "cancelled")
    with pytest.raises(IllegalTransition):
        life.move(r, ReqState.QUEUED)
