"""Dispatcher: the scheduler's queues driven by the pure policy (Algorithm 1, two-level DE)."""
from __future__ import annotations

import pytest

from shared.sched.dispatch import Dispatcher, EngineLoad, Job
from shared.sched.policy import PeThresholds

pytestmark = pytest.mark.unit


def pe(name, tok=0, read_q=0, group="p0"):
    return EngineLoad(name, tok=tok, group=group, node=group, read_q=read_q)


def de(name, tok=0, cap=10_000, group="d0", seq=0):
    return EngineLoad(name, tok=tok, seq=seq, capacity_tokens=cap, group=group, node=group)


def jobs(d: Dispatcher, *sizes, gen=10):
    for i, n in enumerate(sizes):
        d.enqueue(Job(f"r{i}", n, gen))


def test_every_request_gets_both_engines_in_fifo_order():
    d = Dispatcher()
    jobs(d, 100, 200, 300)
    out = d.assign([pe("pe0")], [de("de0")])
    assert [a.req_id for a in out] == ["r0", "r1", "r2"]
    assert all(a.pe == "pe0" and a.de == "de0" for a in out)
    assert d.waiting() == 0


def test_prefill_goes_to_the_least_loaded_ideal_engine_and_loads_update():
    d = Dispatcher()
    jobs(d, 100, 100)
    pes = [pe("a", tok=500), pe("b", tok=50)]
    out = d.assign(pes, [de("de0")])
    assert [a.pe for a in out] == ["b", "b"]  # b stays smallest (50 -> 150 -> 250 < 500)
    assert pes[1].tok == 250 and pes[1].seq == 2


def test_ideal_engines_before_disk_pressured_ones():
    d = Dispatcher(PeThresholds(alpha=1000, beta=10_000))
    jobs(d, 100)
    out = d.assign([pe("pressured", tok=0, read_q=5000), pe("ideal", tok=900)],
                   [de("de0")])
    assert out[0].pe == "ideal"


def test_overloaded_prefill_engines_get_nothing_and_the_queue_waits():
    d = Dispatcher(PeThresholds(alpha=1000, beta=1000))
    jobs(d, 100, 100)
    assert d.assign([pe("busy", tok=1500)], [de("de0")]) == []
    assert d.waiting() == 2
    out = d.assign([pe("busy", tok=0)], [de("de0")])
    assert [a.req_id for a in out] == ["r0", "r1"]


def test_decode_pool_goes_to_the_group_with_fewest_tokens():
    d = Dispatcher()
    jobs(d, 100)
    out = d.assign([pe("pe0")], [de("x0", tok=900, group="gx"), de("y0", tok=100, group="gy")])
    assert out[0].de == "y0"


def test_request_that_fits_no_decode_engine_waits_while_later_ones_are_placed():
    d = Dispatcher()
    jobs(d, 5000, 100, gen=0)
    out = d.assign([pe("pe0")], [de("de0", cap=1000)])
    assert [a.req_id for a in out] == ["r1"]  # level 2 is not strictly FIFO
    assert d.waiting() == 1
    out = d.assign([pe("pe0")], [de("de0", cap=10_000)])
    assert [a.req_id for a in out] == ["r0"] and out[0].pe == "pe0"  # kept its prefill engine


def test_decode_engine_memory_is_never_overcommitted():
    d = Dispatcher()
    jobs(d, 400, 400, 400, gen=0)
    des = [de("de0", cap=1000)]
    out = d.assign([pe("pe0")], des)
    assert len(out) == 2 and des[0].tok == 800


def test_no_engines_means_no_assignment():
    d = Dispatcher()
    jobs(d, 10)
    assert d.assign([], [de("de0")]) == [] and d.assign([pe("pe0")], []) == []
    assert d.waiting() == 1


def test_remove_drops_a_request_wherever_it_waits():
    d = Dispatcher()
    jobs(d, 5000, 100, gen=0)
    d.assign([pe("pe0")], [de("de0", cap=1000)])  # r0 now waits in a DE group's queue
    assert d.remove("r0") and d.waiting() == 0
    jobs(d, 10)
    assert d.remove("r0") and not d.remove("nope")
