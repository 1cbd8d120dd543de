"""Bench numbers: percentiles, SLO attainment, the APS search, the lower bound."""
import math

import pytest

from dualpath.bench.bound import Capacity, lower_bound
from dualpath.bench.metrics import ApsSearch, Slo, meets, percentile, summarise
from dualpath.bench.replay import RunResult, TurnResult, poisson_arrivals

pytestmark = pytest.mark.unit


def turn(ttft=0.1, end=1.1, gen=11, cached=0, prompt=100, job="j", i=0, err=""):
    return TurnResult(job, i, prompt, gen, 0.0, ttft, ttft + 0.05, end, cached, err)


def test_percentile_interpolates_and_ignores_nan():
    assert percentile([1, 2, 3, 4, float("nan")], 50) == 2.5
    assert percentile([5], 99) == 5
    assert percentile([1, 2, 3, 4, 5, 6, 7, 8, 9, 10], 90) == pytest.approx(9.1)
    assert math.isnan(percentile([], 50))


def test_tpot_excludes_the_first_token():
    assert turn(ttft=0.1, end=1.1, gen=11).tpot == pytest.approx(0.1)
    assert math.isnan(turn(gen=1).tpot)


def test_slo_needs_both_ttft_and_tpot_and_no_error():
    slo = Slo(ttft_s=1.0, tpot_s=0.05)
    assert meets(turn(ttft=0.5, end=0.5 + 10 * 0.04), slo)
    assert not meets(turn(ttft=1.5, end=1.5 + 10 * 0.01), slo)
    assert not meets(turn(ttft=0.5, end=0.5 + 10 * 0.06), slo)
    assert not meets(turn(ttft=0.1, end=0.2, err="HTTP 500"), slo)
    assert meets(turn(ttft=0.5, end=0.6, gen=1), slo)  # one token: judged by TTFT only


def test_summary_counts_hits_jct_and_attainment():
    r = RunResult("basic", "offline", None, turns=[turn(cached=0), turn(cached=64, i=1), turn(ttft=9, end=10, i=2)],
                  job_ends={"j": 10.0, "k": 4.0})
    s = summarise(r, Slo(ttft_s=4.0, tpot_s=0.2))
    assert s["jct_s"] == 10.0
    assert s["hit_ratio"] == pytest.approx(64 / 300)
    assert s["slo_attainment"] == pytest.approx(2 / 3)
    assert s["ttft_p50_s"] == pytest.approx(0.1)


def test_aps_search_finds_the_threshold():
    s = ApsSearch(0.5)
    for _ in range(10):
        aps = s.next()
        s.record(aps, aps <= 3.0)
    assert 2.5 < s.best <= 3.0
    assert [a for a, _ in s.history[:4]] == [0.5, 1.0, 2.0, 4.0]


def test_aps_search_reports_zero_when_nothing_passes():
    s = ApsSearch(1.0)
    for _ in range(4):
        s.record(s.next(), False)
    assert s.best == 0.0 and s.next() < 0.1


def test_poisson_arrivals_have_the_requested_rate():
    xs = poisson_arrivals(4000, aps=5.0, seed=1)
    assert xs[0] == 0.0 and all(b >= a for a, b in zip(xs, xs[1:]))
    assert xs[-1] / (len(xs) - 1) == pytest.approx(0.2, rel=0.06)


CAP = Capacity(read_bytes_per_s=1e6, prefill_nodes=1, decode_nodes=2, prefill_engines=1, prefill_tps=1000.0,
               tpot_s=0.01)


def test_bound_storage_term_uses_only_the_nodes_allowed_to_read():
    chains = [[(100, 10), (50, 10)]]
    basic = lower_bound("basic", 6e6, 150, chains, CAP)
    dual = lower_bound("dualpath", 6e6, 150, chains, CAP)
    oracle = lower_bound("oracle", 6e6, 150, chains, CAP)
    assert basic["storage_s"] == pytest.approx(6.0) and basic["limit"] == "storage_s"
    assert dual["storage_s"] == pytest.approx(2.0) and dual["bound_s"] == pytest.approx(2.0)
    assert oracle["storage_s"] == 0.0 and oracle["bound_s"] == pytest.approx(0.33)  # serial chain
    assert oracle["limit"] == "serial_s"


def test_bound_leaves_out_unknown_rates():
    cap = Capacity(None, 1, 1, 2, 1000.0, None)
    b = lower_bound("dualpath", 1e9, 4000, [[(4000, 1)]], cap)
    assert b["storage_s"] is None and b["serial_s"] is None
    assert b["bound_s"] == pytest.approx(2.0) and b["limit"] == "compute_s"
