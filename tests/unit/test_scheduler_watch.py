"""Liveness judged against the scheduler's own stalls (services/scheduler/liveness.Watch)."""
import pytest

from services.scheduler.liveness import Watch

pytestmark = pytest.mark.unit
T = 3.0  # liveness_timeout_s


def ticking(now: float, heard: float | None = None) -> Watch:
    """A watch whose loop last ticked 0.5 s before `now` and that last heard an engine at `heard`."""
    w = Watch(T)
    w.judge(now - 0.5, {}, 0)
    if heard is not None:
        w.heard(heard)
    return w


def test_a_silent_engine_among_live_ones_is_dead_at_once():
    w = ticking(100.0, heard=99.9)
    assert w.judge(100.0, {"d3": 3.2}, 24) == ["d3"]
    assert w.reason == ""


def test_a_late_check_declares_nobody_the_heartbeats_wait_unread():
    w = ticking(100.0, heard=95.0)
    w.last_tick = 94.0  # the scheduler's loop was stuck for 6 s
    silent = {f"e{i}": 5.0 for i in range(1152)}
    assert w.judge(100.0, silent, 1152) == []
    assert "stalled" in w.reason
    w.heard(100.2)  # the next tick, after the buffered heartbeats were read: nobody is silent any more
    assert w.judge(100.5, {}, 1152) == []


def test_a_fleet_wide_silence_is_held_for_the_grace_then_declared():
    w = ticking(100.0, heard=96.5)  # nobody heard for 3.5 s: the bus, or every emulator, stalled
    assert w.judge(100.0, {"p0": 3.5, "d0": 3.4}, 2) == []
    assert "no engine heard" in w.reason
    w.last_tick = 102.6
    assert w.judge(103.0, {"p0": 6.5, "d0": 6.4}, 2) == ["d0", "p0"]  # past 2 x timeout: dead after all


def test_more_than_half_the_fleet_silent_at_once_is_held():
    w = ticking(100.0, heard=99.9)  # others still heard: one emulator process of two... or more
    silent = {f"e{i}": 3.5 for i in range(700)}
    silent["old"] = 6.5  # silent well before the mass silence began
    assert w.judge(100.0, silent, 1152) == ["old"]
    assert "700" not in w.reason and "701 of 1152" in w.reason


def test_half_the_fleet_silent_is_a_real_loss_not_a_stall():
    w = ticking(100.0, heard=99.9)  # one node of two (a cut link): exactly half
    silent = {f"e{i}": 3.2 for i in range(8)}
    assert w.judge(100.0, silent, 16) == sorted(silent)


def test_one_engine_of_a_two_engine_mesh_is_declared():
    w = ticking(100.0, heard=99.9)
    assert w.judge(100.0, {"d0": 3.1}, 2) == ["d0"]


def _rec(rid: str, pe: str, de: str, **kw):
    from services.scheduler.inflight import InFlight
    from shared.messages.work import Sampling

    return InFlight(rid, [1, 2, 3], Sampling(), pe=pe, de=de, **kw)


def test_the_requests_of_engines_that_died_together_are_found_in_one_pass_each_once():
    from services.scheduler.liveness import stranded
    from shared.messages.codes import FinishReason

    both = _rec("both", "p1", "d1")  # its prefill and decode engines died together
    only_de = _rec("de", "p0", "d1")
    streaming = _rec("streaming", "p1", "d0", next_index=5)  # its decode engine already streams
    streaming_dead_de = _rec("streaming-dead-de", "p1", "d1", next_index=5)
    done = _rec("done", "p1", "d1", finished=FinishReason.STOP)
    other = _rec("other", "p0", "d0")
    recs = [both, only_de, streaming, streaming_dead_de, done, other]
    got = stranded(recs, ["d1", "p1"])
    assert [(r.req_id, e) for r, e in got] == [("both", "d1"), ("de", "d1"), ("streaming-dead-de", "d1")]
    got = stranded(recs, ["p1", "d1"])  # the first dead engine (in the judged order) is the one named
    assert [(r.req_id, e) for r, e in got] == [("both", "p1"), ("de", "d1"), ("streaming-dead-de", "d1")]
    assert stranded(recs, []) == [] and stranded(recs, ["p9"]) == []


def test_a_whole_emulator_process_of_engines_declared_at_once_costs_one_walk_of_the_requests():
    from services.scheduler import liveness

    recs = [_rec(f"r{i}", f"p{i % 64}", f"d{i % 128}") for i in range(3000)]
    calls = []
    real = liveness.strands
    liveness.strands = lambda rec, engine: calls.append(engine) or real(rec, engine)
    try:
        got = liveness.stranded(recs, [f"p{i}" for i in range(64)] + [f"d{i}" for i in range(128)])
    finally:
        liveness.strands = real
    assert len(got) == 3000
    assert len(calls) <= 2 * len(recs)  # at most both engines of each record, not engines x records
