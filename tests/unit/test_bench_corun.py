"""The co-run probe (dualpath/bench/corun.py) and stored reports predicted again (dualpath/bench/repredict.py).

The rate probe times each engine alone; on one host the engines computing at once slow each
other beyond time-slicing. The probe's figures, raised for each repeat to what the other repeats'
oracle runs show, give that slowdown.
"""
from __future__ import annotations

import asyncio
import json
import statistics
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import pytest

from dualpath.bench import corun
from dualpath.bench.corun import probe_corun, split_steps
from dualpath.bench.repredict import base_rates, busy_s, corun_from_oracle, oracle_busy, predict_rows, repredict, \
    stored_rates
from dualpath.sim.calibrate import MeshRates, simulate

pytestmark = pytest.mark.unit

DATA = Path(__file__).resolve().parents[2] / "docs" / "results" / "data"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "bench"  # probed runs, trimmed to what repredict reads
RATES = MeshRates(prefill_tok_s=2000.0, turn_overhead_s=0.05, decode_step_s=0.01, decode_per_seq_s=0.002,
                  snic_bytes_s=1e6, data_plane_bytes_s=1e9, kv_bytes_per_token=1000.0, block_tokens=16,
                  prefill_nodes=1, decode_nodes=1, kv_tokens_per_engine=100_000, alpha_tokens=50_000,
                  beta_tokens=4096, host_cores=2)
AGENTS = [[(16, 300)], [(16, 40), (800, 40), (400, 40)], [(16, 2), (1600, 30), (64, 200)]]


def _steps(start: float, n: int, step: float) -> list[float]:
    return [start + i * step for i in range(n)]


def test_steps_beside_the_prefill_are_timed_apart_from_those_around_it():
    # 3 ms a step, 6 ms while a prefill computes in [0.030, 0.060]; the step across 0.060 is left out
    s = _steps(0.0, 11, 0.003) + _steps(0.036, 5, 0.006) + _steps(0.063, 10, 0.003)
    during, around = split_steps([s, [t + 0.0005 for t in s]], 0.030, 0.060)
    assert during == pytest.approx(0.006) and around == pytest.approx(0.003)


def test_too_few_steps_on_either_side_is_none():
    s = _steps(0.0, 20, 0.003)
    assert split_steps([s], 0.0301, 0.0329) is None  # no whole step inside
    assert split_steps([s], 0.003, 0.054) is None  # 2 steps outside


def test_the_probe_sends_the_prefill_once_the_batch_decodes_and_compares_it_with_alone(monkeypatch):
    events: list[asyncio.Event] = []  # one a repeat: set once its fresh prompt is sent
    window: list[float] = []

    async def one_turn(client, url, prompt, gen, mode, t0, stamps_out=None):
        if gen == 1:  # the fresh prompt: 50 ms beside the batch
            window[:] = [time.perf_counter(), 0.05]
            events[-1].set()
            events.append(asyncio.Event())
            return SimpleNamespace(error="", ttft=0.05), []
        if not events:
            events.append(asyncio.Event())
        sent, first = events[-1], time.perf_counter() - 0.03  # its first token came 30 ms ago
        for t in (first, first + 0.003):  # then its first step: it decodes
            stamps_out.append(t)
        await sent.wait()
        lo, ttft = window
        for t in (_steps(first + 0.006, int((lo - first) / 0.003) - 2, 0.003) + _steps(lo + 0.001, 8, 0.006)
                  + _steps(lo + ttft + 0.001, 20, 0.003)):  # 3 ms a step, 6 ms while the prefill computes
            stamps_out.append(t)
        return SimpleNamespace(error="", ttft=1e-4), []

    monkeypatch.setattr(corun, "one_turn", one_turn)
    got = asyncio.run(probe_corun(None, "", 0, 10, (4, 8, 32), (0.025, 0.003), repeat=2))
    assert got == {"corun_prefill_slow": pytest.approx(2.0), "corun_decode_slow": pytest.approx(2.0)}


def test_a_stream_failing_before_the_batch_decodes_fails_the_probe_without_waiting(monkeypatch):
    async def one_turn(client, url, prompt, gen, mode, t0, stamps_out=None):
        return SimpleNamespace(error="HTTP 503", ttft=float("nan")), []

    monkeypatch.setattr(corun, "one_turn", one_turn)
    with pytest.raises(RuntimeError, match="HTTP 503"):
        asyncio.run(probe_corun(None, "", 0, 10, (2, 8, 32), (0.025, 0.003)))


def test_the_oracle_fit_finds_the_slowdowns_that_gave_the_engines_their_seconds():
    truth = replace(RATES, corun_prefill_slow=1.5, corun_decode_slow=1.8)
    measured = busy_s(truth, AGENTS, "oracle")
    assert measured != busy_s(RATES, AGENTS, "oracle")  # the engines do overlap in this workload
    got = corun_from_oracle(RATES, AGENTS, measured)
    assert got.corun_prefill_slow == pytest.approx(1.5, rel=0.02)
    assert got.corun_decode_slow == pytest.approx(1.8, rel=0.02)


def _doc(probe: dict, measured: tuple[float, float] = (2.0, 5.0)) -> dict:
    rows = [{"mode": "oracle", "kind": "offline", "jct_s": 9.0,
             "usage": {"prefill_s": {"p0": measured[0]}, "decode_s": {"d1": measured[1]}}}]
    rates = replace(RATES, **{k: v for k, v in probe.items() if k.startswith("corun_")})  # what the bench stored
    return {"prediction": {"rates": vars(rates), "probe": probe, "turns": {"oracle": AGENTS}}, "runs": rows}


def test_an_older_report_takes_its_oracle_runs():
    fitted = stored_rates(_doc({}))
    assert busy_s(fitted, AGENTS, "oracle") == pytest.approx((2.0, 5.0), rel=0.01)


def _repeats(probe: dict, measured: list[tuple[float, float]]) -> dict:
    """`_doc` with one oracle and one basic row a repeat, repeat k's oracle engines having computed measured[k]."""
    doc = _doc(probe)
    doc["runs"] = [{"mode": mode, "kind": "offline", "jct_s": 9.0, "repeat": k,
                    "usage": {"prefill_s": {"p0": m[0]}, "decode_s": {"d1": m[1]}}}
                   for k, m in enumerate(measured) for mode in ("oracle", "basic")]
    doc["prediction"]["turns"]["basic"] = AGENTS
    return doc


def _predicted(doc: dict) -> dict[tuple[int, str], float]:
    predict_rows(doc, base_rates(doc), doc["prediction"]["turns"])
    return {(r["repeat"], r["mode"]): r["predicted_jct_s"] for r in doc["runs"]}


SLOW = busy_s(replace(RATES, corun_prefill_slow=1.5, corun_decode_slow=1.8), AGENTS, "oracle")
SLOWER = busy_s(replace(RATES, corun_prefill_slow=2.5, corun_decode_slow=2.8), AGENTS, "oracle")


def test_a_repeats_prediction_does_not_read_its_own_oracle_runs():
    before = _predicted(_repeats({}, [SLOW, SLOW]))
    after = _predicted(_repeats({}, [SLOWER, SLOW]))  # only repeat 0's engines measured more
    for mode in ("oracle", "basic"):
        assert after[0, mode] == before[0, mode]
        assert after[1, mode] > before[1, mode]


def test_each_repeat_takes_the_slowdowns_the_other_repeats_oracle_runs_show():
    doc = _repeats({"corun_prefill_slow": 1.1, "corun_decode_slow": 1.2}, [SLOW, busy_s(RATES, AGENTS, "oracle")])
    assert oracle_busy(doc, exclude_repeat=1) == SLOW and oracle_busy(doc, exclude_repeat=0) != SLOW
    _predicted(doc)
    (p0, d0), (p1, d1) = (doc["prediction"]["corun_by_repeat"][k] for k in ("0", "1"))
    assert (p0, d0) == (1.1, 1.2)  # repeat 1's engines computed less than the probe says: the probe's
    assert p1 == pytest.approx(1.5, rel=0.02) and d1 == pytest.approx(1.8, rel=0.02)  # repeat 0's
    assert stored_rates(doc, 0).corun_decode_slow == d0 and stored_rates(doc, 1).corun_decode_slow == d1


def test_with_one_repeat_the_prediction_takes_the_probes_slowdowns():
    doc = _repeats({"corun_prefill_slow": 1.1, "corun_decode_slow": 1.2}, [SLOWER])
    got = _predicted(doc)
    assert doc["prediction"]["corun_by_repeat"] == {"0": [1.1, 1.2]}
    probed = replace(RATES, corun_prefill_slow=1.1, corun_decode_slow=1.2)
    assert got[0, "oracle"] == simulate(probed, AGENTS, "oracle").jct_s
    assert repredict(doc)["oracle"]["measured_over_probe_only"] == repredict(doc)["oracle"]["measured_over_predicted"]


def test_repredict_gives_the_medians_of_the_rows_predictions_and_leaves_the_report_as_it_is():
    doc = _repeats({}, [SLOW, SLOWER, SLOW])
    got = repredict(doc)
    assert "predicted_jct_s" not in doc["runs"][0]
    rows = _predicted(doc)
    assert got["oracle"]["predicted_jct_s"] == statistics.median(rows[k, "oracle"] for k in range(3))
    assert got["basic"]["measured_over_probe_only"] == 9.0 / simulate(RATES, AGENTS, "basic").jct_s
    assert got["basic"]["measured_over_predicted"] < got["basic"]["measured_over_probe_only"]


def test_probed_slowdowns_are_raised_to_what_the_oracle_runs_engines_measured():
    measured = busy_s(replace(RATES, corun_prefill_slow=1.5, corun_decode_slow=1.8), AGENTS, "oracle")
    got = stored_rates(_doc({"corun_prefill_slow": 1.1, "corun_decode_slow": 1.2}, measured))
    assert got.corun_prefill_slow == pytest.approx(1.5, rel=0.02)
    assert got.corun_decode_slow == pytest.approx(1.8, rel=0.02)


def test_probed_slowdowns_stay_where_the_oracle_runs_measured_less():
    probe = {"corun_prefill_slow": 1.5, "corun_decode_slow": 1.8}
    measured = busy_s(replace(RATES, corun_prefill_slow=1.1, corun_decode_slow=1.2), AGENTS, "oracle")
    got = stored_rates(_doc(probe, measured))
    assert (got.corun_prefill_slow, got.corun_decode_slow) == (1.5, 1.8)
    raised = stored_rates(_doc(probe, (measured[0], 3 * measured[1])))  # only decode measured more
    assert raised.corun_prefill_slow == 1.5 and raised.corun_decode_slow > 1.8


def test_a_report_holding_raised_slowdowns_is_raised_from_its_probe_again():
    measured = busy_s(replace(RATES, corun_prefill_slow=1.5, corun_decode_slow=1.8), AGENTS, "oracle")
    doc = _doc({"corun_prefill_slow": 1.1, "corun_decode_slow": 1.2}, measured)
    once = stored_rates(doc)
    doc["prediction"]["rates"] = vars(replace(once, corun_prefill_slow=3.0, corun_decode_slow=3.0))
    assert stored_rates(doc) == once


@pytest.mark.parametrize("name", ["smollm2-probed-notquiet", "tiny-probed"])
def test_probed_bench_reports_are_predicted_within_15_percent_oracle_included(name):
    # SmolLM2's oracle ran 1.34x the prediction at the probe's co-run slowdowns (1.01x / 1.15x): its
    # engines computed 13.4 s / 15.2 s where the simulated ones computed 9.9 s / 11.4 s
    got = repredict(json.loads((FIXTURES / f"{name}.json").read_text()))
    assert set(got) == {"basic", "dualpath", "dualpath-split", "oracle"}
    assert all(0.85 <= v["measured_over_predicted"] <= 1.15 for v in got.values()), got


@pytest.mark.parametrize("name", ["bench-tiny", "bench-smollm2"])
def test_the_stored_bench_reports_are_predicted_within_15_percent(name):
    got = repredict(json.loads((DATA / f"{name}.json").read_text()))
    assert set(got) == {"basic", "dualpath", "dualpath-split", "oracle"}
    assert all(0.85 <= v["measured_over_predicted"] <= 1.15 for v in got.values()), got
