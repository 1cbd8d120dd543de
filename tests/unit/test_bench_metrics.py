"""Bench numbers: percentiles, SLO attainment, the APS search, the lower bound."""
import math

import pytest

from dualpath.bench.bound import ChainTurn, MeshCapacity, lower_bound
from dualpath.bench.metrics import ApsSearch, Slo, meets, percentile, summarise, summary, verdict
from dualpath.bench.usage import Usage
from dualpath.bench.replay import RunResult, TurnResult, poisson_arrivals

pytestmark = pytest.mark.unit


def turn(ttft=0.1, end=1.1, gen=11, cached=0, prompt=100, job="j", i=0, err="", start=0.0):
    return TurnResult(job, i, prompt, gen, start, ttft, ttft + 0.05, start + end, cached, err)


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


def test_aps_search_doubles_then_bisects_to_the_precision():
    s = ApsSearch(0.5, precision=0.1)
    while (aps := s.next()) is not None:
        s.record(aps, aps <= 3.0)
    assert [a for a, _ in s.history[:4]] == [0.5, 1.0, 2.0, 4.0]
    assert 2.0 <= s.best <= 3.0 < s.bad <= s.best * 1.1  # the capacity is known to within 10%
    assert len(s.history) <= 9


def test_aps_search_reports_zero_when_nothing_passes():
    s = ApsSearch(1.0, max_levels=4)
    while (aps := s.next()) is not None:
        s.record(aps, False)
    assert s.best == 0.0 and len(s.history) == 4 and s.aps < 0.1


def test_a_level_holds_on_steady_means_and_says_which_term_failed():
    slo = Slo(ttft_s=1.0, tpot_s=0.05, warmup=0.5)
    warm = [turn(ttft=5.0, end=5.5, i=0)]  # the warm-up turn is left out
    good = RunResult("dualpath", "online", 1.0, turns=warm + [turn(ttft=0.5, end=0.5 + 10 * 0.04, i=1, start=1.0)])
    assert verdict(good, slo)[:2] == (True, "")
    slow = RunResult("dualpath", "online", 1.0, turns=warm + [turn(ttft=0.5, end=0.5 + 10 * 0.09, i=1, start=1.0)])
    assert verdict(slow, slo)[:2] == (False, "tpot")
    late = RunResult("dualpath", "online", 1.0, turns=[turn(ttft=2.0, i=0), turn(ttft=3.0, i=1)])
    assert verdict(late, slo)[1] == "ttft"
    stopped = RunResult("basic", "online", 1.0, turns=[turn(ttft=0.1)], stopped="mean TTFT 9 s")
    assert verdict(stopped, slo)[1].startswith("ttft (stopped")
    broken = RunResult("basic", "online", 1.0, turns=[turn(), turn(err="HTTP 500", i=1)])
    assert verdict(broken, Slo(ttft_s=9.0, tpot_s=1.0))[1] == "errors"


def test_poisson_arrivals_have_the_requested_rate():
    xs = poisson_arrivals(4000, aps=5.0, seed=1)
    assert xs[0] == 0.0 and all(b >= a for a, b in zip(xs, xs[1:]))
    assert xs[-1] / (len(xs) - 1) == pytest.approx(0.2, rel=0.06)


CAP = MeshCapacity(read_bytes_per_s=1e6, prefill_nodes=1, decode_nodes=2, prefill_engines=1, prefill_tps=1000.0,
               tpot_s=0.01, write_bytes_per_s=1e6, cores=2, data_plane_bytes_per_s=1e9)


def _used(read=6e6, written=None, prefill=1.0, decode=0.5, dp=1e8, cpu=3.0):
    return Usage(read_bytes={"p0": read}, written_bytes=written or {"d1": 2e6}, prefill_s={"pe": prefill},
                 decode_s={"de": decode}, data_plane_bytes=dp, cpu_s=cpu)


def test_bound_storage_term_uses_only_the_nodes_allowed_to_read():
    chains = [[(100, 10, 0.0), (50, 10, 1e5)]]
    basic = lower_bound("basic", _used(), chains, CAP)
    dual = lower_bound("dualpath", _used(), chains, CAP)
    oracle = lower_bound("oracle", _used(read=0, written={"d1": 0.0}), chains, CAP)
    assert basic["storage_read_s"] == pytest.approx(6.0) and basic["limit"] == "storage_read_s"
    assert dual["storage_read_s"] == pytest.approx(2.0) and dual["bound_s"] == pytest.approx(2.0)
    assert oracle["storage_read_s"] == 0.0 and oracle["limit"] == "cpu_s" and oracle["bound_s"] == pytest.approx(1.5)


def test_bound_counts_writes_compute_cores_data_plane_and_the_chain():
    b = lower_bound("dualpath", _used(read=0, written={"d1": 5e6, "p0": 1e6}, prefill=4.0, decode=3.0, dp=2e9,
                                      cpu=2.0), [[(2000, 101, 5e5)]], CAP)
    assert b["storage_write_s"] == pytest.approx(5.0)  # the node that wrote most, at its own rate
    assert b["prefill_s"] == 4.0 and b["decode_s"] == 3.0 and b["engines_cores_s"] == pytest.approx(3.5)
    assert b["data_plane_s"] == pytest.approx(2.0) and b["cpu_s"] == pytest.approx(1.0)
    # its own read (0.5 s) overlaps its prefill (2 s); then 100 decode steps of 10 ms
    assert b["serial_s"] == pytest.approx(3.0)
    assert b["limit"] == "storage_write_s" and b["bound_s"] == pytest.approx(5.0)
    split = lower_bound("dualpath-split", _used(), [[(0, 1, 4e6)]], CAP)
    assert split["serial_s"] == pytest.approx(2.0)  # one request's read on both storage NICs


def test_engines_on_shared_cores_count_no_engine_above_its_cpu():
    # three engines on two cores: each step's wall time includes waiting for a core, so wall
    # seconds summed would pass the run; each engine counts at most its process's CPU seconds
    used = Usage(prefill_s={"pe": 10.0}, decode_s={"d1": 10.0, "d2": 10.0}, engine_cpu_s={"pe": 6.0, "d1": 7.0})
    b = lower_bound("oracle", used, [], CAP)
    assert b["engines_cores_s"] == pytest.approx((6.0 + 7.0 + 10.0) / 2)  # d2's CPU unknown: its wall


def test_chain_turns_never_count_more_than_the_turn_took():
    # the probe said 10 ms a token and 1,000 prompt tokens a second; this run did better (a quieter
    # moment on a shared machine): each part of the chain is what the turn really took at most
    chains = [[ChainTurn(2000, 101, 0.0, first_s=0.5, rest_s=0.4), ChainTurn(100, 11, 0.0, first_s=1.0, rest_s=1.0)]]
    b = lower_bound("oracle", _used(read=0, written={"d1": 0.0}, cpu=0.0), chains, CAP)
    assert b["serial_s"] == pytest.approx(0.5 + 0.4 + 0.1 + 0.1)
    unknown = lower_bound("oracle", _used(read=0, written={"d1": 0.0}, cpu=0.0),
                          [[ChainTurn(2000, 101, 0.0, float("nan"), float("nan"))]], CAP)
    assert unknown["serial_s"] == pytest.approx(3.0)  # no measurement: the probe's rates


def test_bound_leaves_out_unknown_rates():
    cap = MeshCapacity(None, 1, 1, 2, 1000.0, None)
    b = lower_bound("dualpath", Usage(prefill_s={"pe": 2.0}), [[(4000, 1, 0.0)]], cap)
    assert b["storage_read_s"] is None and b["serial_s"] is None and b["cpu_s"] is None
    assert b["bound_s"] == pytest.approx(2.0) and b["limit"] == "prefill_s"


def _off(mode, repeat, jct, bound, hit=0.9):
    return {"mode": mode, "kind": "offline", "repeat": repeat, "jct_s": jct, "jct_lower_bound_s": bound,
            "jct_over_bound": jct / bound, "hit_ratio": hit, "storage_read_bytes_per_node": {"p0": 2.0, "d1": 2.0},
            "bound": {"limit": "storage_read_s", "storage_read_s": bound}}


def test_summary_takes_medians_over_repeats_and_pairs_runs_of_one_repeat():
    rows = [_off("basic", k, jct, 10.0) for k, jct in enumerate((12.0, 11.0, 30.0))]
    rows += [_off("dualpath", k, jct, 5.0, hit=0.89) for k, jct in enumerate((6.0, 6.5, 10.0))]
    s = summary(rows)
    assert s["offline"]["basic"]["jct_s"] == {"median": 12.0, "min": 11.0, "max": 30.0, "n": 3}
    assert s["offline"]["dualpath"]["jct_over_bound"]["median"] == pytest.approx(1.3)
    pair = s["pairs"]["dualpath/basic"]
    assert pair["speedup"]["median"] == pytest.approx(2.0)  # 12/6, 11/6.5, 30/10
    assert pair["bound_ratio"]["median"] == 2.0 and pair["of_bound_ratio"]["median"] == pytest.approx(1.0)
    assert s["offline"]["dualpath"]["read_max_over_avg"]["median"] == 1.0
    assert s["hit_ratio_spread"] == pytest.approx(0.01)
