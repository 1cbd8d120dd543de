"""Dispatcher: one FIFO queue; least-loaded PE, least-loaded DE that can hold the request."""
from __future__ import annotations

import pytest

from services.scheduler.dispatch import Assignment, Dispatcher, EngineLoad, Job

pytestmark = pytest.mark.unit


def queue(*jobs: Job) -> Dispatcher:
    d = Dispatcher()
    for j in jobs:
        d.enqueue(j)
    return d


def job(rid: str, prompt: int = 10, gen: int = 10) -> Job:
    return Job(rid, prompt, gen)


def pe(name: str, tok: int = 0, seq: int = 0) -> EngineLoad:
    return EngineLoad(name, tok=tok, seq=seq)


def de(name: str, cap: int = 1000, tok: int = 0, seq: int = 0) -> EngineLoad:
    return EngineLoad(name, tok=tok, seq=seq, capacity_tokens=cap)


def test_job_tokens_are_prompt_plus_max_tokens():
    assert Job("r", 7, 5).tokens == 12


def test_requests_are_assigned_in_arrival_order():
    d = queue(job("r1"), job("r2"), job("r3"))
    out = d.assign([pe("p")], [de("d")])
    assert [a.req_id for a in out] == ["r1", "r2", "r3"]
    assert not d.queue


def test_nothing_is_assigned_without_prefill_or_decode_engines():
    d = queue(job("r1"))
    assert d.assign([], [de("d")]) == []
    assert d.assign([pe("p")], []) == []
    assert [j.req_id for j in d.queue] == ["r1"]


def test_empty_queue_assigns_nothing():
    assert Dispatcher().assign([pe("p")], [de("d")]) == []


def test_prefill_engine_with_fewest_outstanding_tokens_wins():
    out = queue(job("r")).assign([pe("p0", tok=50), pe("p1", tok=20), pe("p2", tok=30)], [de("d")])
    assert out == [Assignment("r", "p1", "d")]


def test_decode_engine_with_fewest_outstanding_tokens_wins():
    out = queue(job("r")).assign([pe("p")], [de("d0", tok=300), de("d1", tok=100), de("d2", tok=200)])
    assert out[0].de == "d1"


def test_ties_break_on_sequences_then_engine_name():
    out = queue(job("r1")).assign([pe("pb", seq=1), pe("pa", seq=2), pe("pc", seq=1)],
                                  [de("db"), de("da")])
    assert (out[0].pe, out[0].de) == ("pb", "da")


def test_loads_are_updated_in_place_and_spread_later_requests():
    pes, des = [pe("p0"), pe("p1")], [de("d0"), de("d1")]
    out = queue(job("r1", 10, 10), job("r2", 10, 10)).assign(pes, des)
    assert [(a.pe, a.de) for a in out] == [("p0", "d0"), ("p1", "d1")]
    assert [(e.tok, e.seq) for e in pes + des] == [(20, 1)] * 4


def test_decode_engine_must_have_room_for_prompt_plus_max_tokens():
    # d0 is least loaded but too small; d1 has room
    out = queue(job("r", 60, 40)).assign([pe("p")], [de("d0", cap=99), de("d1", cap=500, tok=300, seq=3)])
    assert out[0].de == "d1"


def test_decode_engine_exactly_full_fits():
    out = queue(job("r", 60, 40)).assign([pe("p")], [de("d", cap=150, tok=50, seq=1)])
    assert out == [Assignment("r", "p", "d")]


def test_prefill_choice_ignores_decode_capacity():
    out = queue(job("r", 60, 40)).assign([pe("p", tok=10 ** 6)], [de("d", cap=100)])
    assert out[0].pe == "p"


def test_head_that_fits_no_decode_engine_blocks_the_queue():
    d = queue(job("big", 900, 100), job("small", 1, 1))
    out = d.assign([pe("p")], [de("d", cap=500)])
    assert out == []
    assert [j.req_id for j in d.queue] == ["big", "small"]  # FIFO: small does not overtake


def test_head_blocked_by_load_proceeds_once_load_drops():
    d = queue(job("r1", 50, 50), job("r2", 50, 50))
    des = [de("d", cap=150)]
    assert [a.req_id for a in d.assign([pe("p")], des)] == ["r1"]
    assert [j.req_id for j in d.queue] == ["r2"]
    des[0].tok, des[0].seq = 0, 0  # r1 finished
    assert [a.req_id for a in d.assign([pe("p")], des)] == ["r2"]


def test_assignment_stops_at_first_blocked_request_but_keeps_earlier_ones():
    d = queue(job("a", 40, 10), job("b", 40, 10), job("c", 1, 1))
    out = d.assign([pe("p")], [de("d", cap=100)])
    assert [a.req_id for a in out] == ["a", "b"]
    assert [j.req_id for j in d.queue] == ["c"]
    d2 = queue(job("a", 40, 10), job("b", 60, 10), job("c", 1, 1))
    assert [a.req_id for a in d2.assign([pe("p")], [de("d", cap=100)])] == ["a"]
    assert [j.req_id for j in d2.queue] == ["b", "c"]


def test_remove_drops_a_queued_request():
    d = queue(job("r1"), job("r2"), job("r3"))
    assert d.remove("r2") is True
    assert [j.req_id for j in d.queue] == ["r1", "r3"]


def test_remove_unknown_request_returns_false():
    d = queue(job("r1"))
    assert d.remove("nope") is False
    assert len(d.queue) == 1


def test_removed_request_is_never_assigned():
    d = queue(job("r1"), job("r2"))
    d.remove("r1")
    assert [a.req_id for a in d.assign([pe("p")], [de("d")])] == ["r2"]


def test_removing_the_blocked_head_unblocks_the_queue():
    d = queue(job("big", 900, 100), job("small", 1, 1))
    assert d.assign([pe("p")], [de("d", cap=500)]) == []
    d.remove("big")
    assert [a.req_id for a in d.assign([pe("p")], [de("d", cap=500)])] == ["small"]
