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
