"""Dispatcher pulls: prefill rotation and counts, the reports the policy sees, cached rosters, idle DE groups."""
from __future__ import annotations

import pytest

from shared.sched import dispatch
from shared.sched.dispatch import Dispatcher, EngineLoad, Job
from shared.sched.policy import PeThresholds
from shared.sched.policy.de_assign import LOOKAHEAD

pytestmark = pytest.mark.unit


# each engine is a group (and a node) of its own unless told otherwise
def pe(name, tok=0, group=None, node=None, read_q=0, seq=0):
    return EngineLoad(name, tok=tok, seq=seq, group=group or name, node=node or group or name, read_q=read_q)


def de(name, tok=0, cap=10_000, group=None, seq=0, node=None):
    return EngineLoad(name, tok=tok, seq=seq, capacity_tokens=cap, group=group or name, node=node or group or name)


def job(d: Dispatcher, rid, prompt, gen=0):
    d.enqueue(Job(rid, prompt, gen))


def spy(monkeypatch, name):
    """Record the (queue, reports) of every call to dispatch's `name` policy function."""
    real, calls = getattr(dispatch, name), []

    def wrapped(queue, reports, *rest):
        calls.append((list(queue), list(reports)))
        return real(queue, reports, *rest)
    monkeypatch.setattr(dispatch, name, wrapped)
    return calls


# prefill ---------------------------------------------------------------------------------
def test_pull_prefill_returns_how_many_requests_got_a_pe():
    d = Dispatcher()
    pes = [pe("a"), pe("b")]
    assert d.pull_prefill([]) == 0 and d.pull_prefill(pes) == 0  # no groups; an empty queue
    for i in range(3):
        job(d, f"r{i}", 10)
    assert d.pull_prefill(pes) == 3
    assert d.pull_prefill(pes) == 0


def test_consecutive_pulls_start_at_successive_groups():
    d = Dispatcher()
    pes = [pe("a"), pe("b"), pe("c")]
    first = []
    for i in range(4):
        job(d, f"r{i}", 10)
        d.pull_prefill(pes)
        first.append(d.pe_of[f"r{i}"])
    at = ["abc".index(name) for name in first]
    assert all((b - a) % 3 == 1 for a, b in zip(at, at[1:])), first


def test_after_the_first_group_the_pull_goes_on_in_ascending_order():
    d = Dispatcher(PeThresholds(alpha=1 << 30, beta=50))  # one 100-token job overloads an engine
    pes = [pe("a"), pe("b"), pe("c")]
    for _ in range(3):
        job(d, "x", 100)
        job(d, "y", 100)
        assert d.pull_prefill(pes) == 2
        x, y = "abc".index(d.pe_of["x"]), "abc".index(d.pe_of["y"])
        assert (y - x) % 3 == 1
        for rid in ("x", "y"):
            d.remove(rid)
        for e in pes:
            e.tok = 0


def test_an_engine_exactly_at_beta_still_takes_work():
    d = Dispatcher(PeThresholds(alpha=1 << 30, beta=100))
    job(d, "r0", 10)
    assert d.pull_prefill([pe("a", tok=100)]) == 1


def test_an_overloaded_group_does_not_stop_the_groups_after_it():
    d = Dispatcher(PeThresholds(alpha=1 << 30, beta=100))
    pes = [pe("busy", tok=500), pe("free")]
    for i in range(2):  # the rotation puts the busy group first in one of the two pulls
        job(d, f"r{i}", 10)
        assert d.pull_prefill(pes) == 1 and d.pe_of[f"r{i}"] == "free"


def test_prefill_reports_carry_each_engines_seq_tok_read_q_and_node(monkeypatch):
    calls = spy(monkeypatch, "assign_prefill")
    d = Dispatcher()
    pes = [pe("a", tok=5, seq=1, read_q=7, group="g", node="n0"), pe("b", tok=6, seq=2, read_q=8, group="g", node="n0"),
           pe("c", tok=9, seq=3, read_q=0, group="g", node="n1")]
    job(d, "r0", 10)
    d.pull_prefill(pes)
    (_, reports), = calls
    assert [(r.seq, r.tokens, r.read_q) for r in reports] == [(1, 5, 7), (2, 6, 8), (3, 9, 0)]
    assert reports[0].node == reports[1].node != reports[2].node
    assert len({r.engine for r in reports}) == 3


def test_decode_reports_carry_each_engines_seq_tok_free_memory_and_node(monkeypatch):
    calls = spy(monkeypatch, "assign_decode")
    d = Dispatcher()
    des = [de("a", tok=5, seq=1, cap=100, group="g", node="n0"), de("b", tok=6, seq=2, cap=50, group="g", node="n1")]
    job(d, "r0", 10)
    d.assign([pe("p")], des)
    (_, reports), = calls
    assert [(r.seq, r.tokens, r.free_mem) for r in reports] == [(1, 5, 95), (2, 6, 44)]
    assert reports[0].node != reports[1].node and reports[0].engine != reports[1].engine



@pytest.mark.parametrize("none", ["", None])
def test_a_decode_engine_without_a_group_is_a_group_of_its_own(none):
    # Level 1 picks a (48 tokens < 50). One group of both would give b: Z = 1.05 * (1 + 98) / 2 = 51.98
    # keeps both below Z, and b has the fewer requests.
    d = Dispatcher()
    des = [EngineLoad("a", tok=48, seq=5, capacity_tokens=1000, group=none),
           EngineLoad("b", tok=50, seq=0, capacity_tokens=1000, group=none)]
    job(d, "r0", 1)
    assert [a.de for a in d.assign([pe("p")], des)] == ["a"]

# rosters ---------------------------------------------------------------------------------
def test_assign_passes_changed_on_a_line_left_out_keeps_its_kept_total():
    d = Dispatcher()
    pes, des = [pe("p")], [de("x0", group="gx"), de("y0", tok=500, group="gy")]
    d.assign(pes, des)  # counts the totals: gx 0, gy 500
    des[0].tok = 1000  # not named below: the decode pull still counts gx at 0
    job(d, "r0", 10)
    assert [a.de for a in d.assign(pes, des, changed=[])] == ["x0"]
    job(d, "r1", 10)
    assert [a.de for a in d.assign(pes, des, changed=["x0"])] == ["y0"]


def test_each_line_list_keeps_its_own_roster():
    d = Dispatcher()
    a, b = [de("a0"), de("a1")], [de("b0")]
    ra, rb, rp = d._roster("decode", a), d._roster("decode", b), d._roster("prefill", a)
    assert len({id(ra), id(rb), id(rp)}) == 3  # a list used for both roles has two
    assert d._roster("decode", a) is ra and d._roster("decode", b) is rb


def test_a_list_with_one_line_replaced_gets_a_new_roster():
    d = Dispatcher(PeThresholds(alpha=1 << 30, beta=100))
    busy, old, new = pe("busy", tok=500, group="g"), pe("old", group="g"), pe("new", group="g")
    d.pull_prefill([busy, old])
    job(d, "r0", 10)
    assert d.pull_prefill([busy, new]) == 1  # same first line, same length
    assert d.pe_of["r0"] == "new" and new.seq == 1 and old.seq == 0


def test_the_roster_cache_holds_at_most_rosters(monkeypatch):
    monkeypatch.setattr(dispatch, "ROSTERS", 2)
    d = Dispatcher()
    for i in range(5):
        d.pull_prefill([pe(f"p{i}")])  # fresh lines each round
        assert len(d._rosters) <= 2


def test_fresh_lines_for_the_same_engines_reuse_their_ids():
    d = Dispatcher()
    d.pull_prefill([pe("a", node="n"), pe("b", node="n")])
    known = dict(d._eid)
    for _ in range(3):
        d.pull_prefill([pe("a", node="n"), pe("b", node="n")])
    assert d._eid == known


# idle decode groups ----------------------------------------------------------------------
def test_new_requests_wake_an_idle_group_whose_lines_did_not_change():
    d = Dispatcher()
    pes, des = [pe("p")], [de("d0", cap=1000)]
    job(d, "big", 5000)
    assert d.assign(pes, des) == []  # fits nowhere: the group goes idle
    job(d, "small", 100)
    assert [a.req_id for a in d.assign(pes, des)] == ["small"]


@pytest.mark.parametrize("changed", [None, []])
def test_an_idle_group_with_unchanged_lines_is_not_scanned_again(monkeypatch, changed):
    calls = spy(monkeypatch, "assign_decode")
    d = Dispatcher()
    pes, des = [pe("p")], [de("d0", cap=1000)]
    job(d, "big", 5000)
    d.assign(pes, des)
    d.assign(pes, des, changed)
    assert len(calls) == 1
    des[0].capacity_tokens = 6000
    assert [a.req_id for a in d.assign(pes, des, None if changed is None else ["d0"])] == ["big"]


def test_a_skipped_idle_group_does_not_stop_the_groups_after_it():
    d = Dispatcher()
    pes, des = [pe("p")], [de("a0", tok=20, cap=1000, group="ga"), de("b0", tok=30, cap=1000, group="gb")]
    job(d, "big", 5000)
    assert d.assign(pes, des) == []  # to ga (fewer tokens), where it fits nowhere
    des[1].tok = 10
    job(d, "small", 100)
    out = d.assign(pes, des)  # ga is skipped (idle, unchanged); gb gets the pool
    assert [(a.req_id, a.de) for a in out] == [("small", "b0")]


def test_requests_of_a_group_that_left_wait_for_it_to_come_back():
    d = Dispatcher()
    pes, gone, other = [pe("p")], de("x0", cap=1000, group="gx"), de("y0", tok=100, cap=1000, group="gy")
    job(d, "big", 5000)
    d.assign(pes, [gone, other])  # waits in gx's queue
    assert d.assign(pes, [other]) == [] and d.waiting() == 1
    gone.capacity_tokens = 6000
    assert [a.req_id for a in d.assign(pes, [gone, other])] == ["big"]


def test_cancelling_a_request_in_an_idle_group_lets_the_group_scan_again():
    d = Dispatcher()
    pes, des = [pe("p")], [de("d0", cap=1000)]
    for i in range(LOOKAHEAD):
        job(d, f"big{i}", 5000)
    job(d, "small", 100)  # just past the scan window behind the big ones
    assert d.assign(pes, des) == []
    assert d.remove("big0")
    assert [a.req_id for a in d.assign(pes, des)] == ["small"]


def test_cancelling_a_request_leaves_the_other_idle_groups_skipped(monkeypatch):
    d = Dispatcher()
    pes, des = [pe("p")], [de("a0", cap=1000, group="ga"), de("b0", tok=1, cap=1000, group="gb")]
    job(d, "big_a", 5000)
    d.assign(pes, des)  # to ga
    des[0].tok = 2
    job(d, "big_b", 6000)
    d.assign(pes, des, ["a0"])  # to gb; both groups idle now
    job(d, "doomed", 7000)
    d.assign(pes, des, [])  # to gb (fewest tokens): gb scanned again, still idle
    calls = spy(monkeypatch, "assign_decode")
    d.remove("doomed")
    d.assign(pes, des, [])
    assert [[r.mem for r in q] for q, _ in calls] == [[6000]]  # gb only, big_b left in its queue


# removal ---------------------------------------------------------------------------------
def test_removing_a_request_in_the_pool_keeps_the_others_and_forgets_its_pe():
    d = Dispatcher()
    for rid in ("r0", "r1"):
        job(d, rid, 10)
    assert d.pull_prefill([pe("p")]) == 2  # both in the DE pool, each holding a PE
    assert d.remove("r0") and "r0" not in d.pe_of
    assert [(a.req_id, a.pe) for a in d.pull_decode([de("d0")])] == [("r1", "p")]
    assert d.waiting() == 0 and d.pe_of == {}
