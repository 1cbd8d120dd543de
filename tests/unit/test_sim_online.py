"""The online stop rule (SLO windows, steady state against the window a lag before) and TTST."""
from dataclasses import replace

import pytest

from dualpath.sim.config import SimConfig
from dualpath.sim.engine import run_sim
from dualpath.sim.online import StopRule

pytestmark = pytest.mark.unit


def rule(**kw) -> StopRule:
    args = dict(window_s=10.0, lag_s=30.0, tol=0.05, slo_ttft_s=4.0, slo_tpot_s=0.05, max_s=100.0)
    return StopRule(**(args | kw))


def feed(r: StopRule, t0: float, t1: float, ttft: float, tpot: float = 0.02, n: int = 5) -> None:
    for i in range(n):
        t = t0 + (t1 - t0) * (i + 0.5) / n
        r.arrived(t)
        r.first_token(t, ttft)
        r.finished(t, tpot)


def test_a_window_over_the_ttft_slo_fails_the_rate():
    r = rule()
    feed(r, 0, 10, 1.0)
    assert r.check(10.0) is None
    feed(r, 10, 20, 5.0)
    v = r.check(20.0)
    assert v is not None and not v.ok and v.reason == "ttft over SLO" and v.stop_s == 20.0


def test_requests_still_waiting_count_with_their_wait_so_far():
    r = rule()
    for t in (1.0, 2.0, 3.0):
        r.arrived(t)  # never get a first token
    v = r.check(10.0)
    assert v is not None and v.reason == "ttft over SLO" and v.ttft_s == pytest.approx(8.0)


def test_tpot_over_the_slo_fails_too():
    r = rule()
    feed(r, 0, 10, 1.0, tpot=0.08)
    assert r.check(10.0).reason == "tpot over SLO"


def test_steady_when_a_window_is_within_tolerance_of_the_one_a_lag_before():
    r = rule()
    ttfts = [1.0, 1.5, 2.0, 1.02]  # windows ending 10, 20, 30, 40: 40's is 2% off 10's (lag 30)
    for k, v in enumerate(ttfts):
        feed(r, 10 * k, 10 * (k + 1), v)
        got = r.check(10.0 * (k + 1))
        if k < 3:
            assert got is None
    assert got is not None and got.ok and got.reason == "steady" and got.stop_s == 40.0
    assert [w[1] for w in got.windows] == pytest.approx(ttfts)


def test_a_cap_reached_without_arrivals_proves_nothing():
    r = rule(max_s=20.0)
    feed(r, 0, 10, 1.0)
    r.check(10.0)
    v = r.check(20.0)  # the agents ran out: no arrivals in the last window
    assert v is not None and v.reason == "cap" and not v.ok


def test_a_run_that_never_settles_stops_at_the_cap():
    r = rule(max_s=30.0)
    for k, v in enumerate([1.0, 2.0, 3.0]):
        feed(r, 10 * k, 10 * (k + 1), v)
        got = r.check(10.0 * (k + 1))
    assert got is not None and got.reason == "cap" and got.ok


def test_an_online_run_stops_by_the_rule_and_reports_ttst():
    cfg = SimConfig(model="ds-27b", P=1, D=1, trace="gen:32k:20", agents=6000, scale=0.3, window_s=20.0,
                    steady_lag_s=40.0, duration_s=200.0)
    light = run_sim(replace(cfg, aps=0.5))
    heavy = run_sim(replace(cfg, aps=150.0))
    assert light.slo_ok and light.stop_reason in ("steady", "cap") and light.run_s <= 200.0
    assert not heavy.slo_ok and heavy.stop_reason == "ttft over SLO" and heavy.ttft_window_s > 4.0
    assert light.ttst_p50_s > light.ttft_p50_s  # the second token comes one decode step after the first
    assert light.ttst_p50_s - light.ttft_p50_s < 0.5
    assert light.windows and light.windows[-1][0] == light.run_s
