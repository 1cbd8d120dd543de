"""The bench's prediction takes the data-plane bandwidth its run measured, under the key the transport bench
writes, and for each repeat the co-run slowdowns the other repeats' oracle runs' engines measured where
those exceed the probe's."""
from __future__ import annotations

import json
import statistics
from dataclasses import replace
from types import SimpleNamespace

import pytest

from dualpath.bench.predict import DEFAULT_DATA_PLANE, add_predictions, data_plane_bytes_s, rates
from dualpath.bench.repredict import busy_s, repredict, restamp
from dualpath.sim.calibrate import simulate

pytestmark = pytest.mark.unit


def test_measured_shm_scattered_bandwidth_is_used():
    doc = {"data_plane": {"throughput": {"shm_contiguous_gb_s": 3.0, "shm_scattered_gb_s": 2.5}}}
    assert data_plane_bytes_s(doc) == 2.5e9


def test_default_without_a_data_plane_run():
    assert data_plane_bytes_s({}) == DEFAULT_DATA_PLANE
    assert data_plane_bytes_s({"data_plane": {"isolation": {}}}) == DEFAULT_DATA_PLANE


AGENTS = [[(16, 300)], [(16, 40), (800, 40), (400, 40)], [(16, 2), (1600, 30), (64, 200)]]
PROBE = {"prefill_tok_s": 2000.0, "turn_overhead_s": 0.05, "decode_step_s": 0.01, "decode_per_seq_s": 0.002,
         "background_cores": 0.0, "corun_prefill_slow": 1.1, "corun_decode_slow": 1.2}


def _bench(*measured: tuple[float, float] | None) -> tuple[dict, SimpleNamespace]:
    """A bench document with one oracle row a repeat; repeat k's engines computed measured[k] (None: no usage)."""
    rows = [{"mode": "oracle", "kind": "offline", "jct_s": 9.0, "repeat": k} for k in range(len(measured))]
    for row, m in zip(rows, measured):
        if m:
            row["usage"] = {"prefill_s": {"p0-e0": m[0]}, "decode_s": {"d1-e0": m[1]}}
    cap = SimpleNamespace(rates=PROBE, prefill_nodes=1, decode_nodes=1, cores=2)
    return {"config": {"block_size": 16, "kv_bytes_per_block": 16000.0}, "runs": rows}, cap


def test_each_repeat_is_predicted_at_the_slowdowns_the_other_repeats_oracle_runs_measured():
    doc, cap = _bench(None)
    probed = rates(doc, cap, {}, [], 8.0)
    truth = replace(probed, corun_prefill_slow=1.5, corun_decode_slow=1.8)
    doc, cap = _bench(busy_s(truth, AGENTS, "oracle"), busy_s(probed, AGENTS, "oracle"))
    add_predictions(doc, cap, {}, [], 8.0, {"oracle": AGENTS})
    pred = doc["prediction"]
    assert (pred["rates"]["corun_prefill_slow"], pred["rates"]["corun_decode_slow"]) == (1.1, 1.2)  # the probe's
    assert pred["corun_by_repeat"]["0"] == pytest.approx([1.1, 1.2], rel=0.01)  # repeat 1's engines: as probed
    assert pred["corun_by_repeat"]["1"] == pytest.approx([1.5, 1.8], rel=0.02)  # repeat 0's: slower
    first, second = doc["runs"]
    assert first["predicted_jct_s"] == pytest.approx(simulate(probed, AGENTS, "oracle").jct_s, rel=0.03)
    assert second["predicted_jct_s"] == pytest.approx(simulate(truth, AGENTS, "oracle").jct_s, rel=0.03)
    assert first["predicted_probe_only_jct_s"] == second["predicted_probe_only_jct_s"] == simulate(
        probed, AGENTS, "oracle").jct_s
    assert second["measured_over_probe_only"] == 9.0 / second["predicted_probe_only_jct_s"]


def test_repredict_reproduces_what_the_bench_stored():
    probed = rates(*_bench(None), {}, [], 8.0)
    doc, cap = _bench(busy_s(replace(probed, corun_decode_slow=2.0), AGENTS, "oracle"), (1.0, 1.0), (3.0, 9.0))
    add_predictions(doc, cap, {}, [], 8.0, {"oracle": AGENTS})
    got = repredict(json.loads(json.dumps(doc)))["oracle"]  # as stored: JSON, turns as lists
    assert got["predicted_jct_s"] == statistics.median(r["predicted_jct_s"] for r in doc["runs"])
    assert got["measured_over_predicted"] == statistics.median(r["measured_over_predicted"] for r in doc["runs"])


def test_an_older_report_is_restamped_as_the_bench_now_predicts_it():
    doc, cap = _bench((1.0, 1.0), (3.0, 9.0), (2.0, 4.0))
    add_predictions(doc, cap, {}, [], 8.0, {"oracle": AGENTS})
    now = json.loads(json.dumps(doc))
    older = json.loads(json.dumps(doc))  # in sample: raised rates, rows predicted at them, no per-repeat slowdowns
    del older["prediction"]["corun_by_repeat"]
    older["prediction"]["rates"].update(corun_prefill_slow=2.0, corun_decode_slow=2.5)
    for row in older["runs"]:
        row.update(predicted_jct_s=1.0, measured_over_predicted=9.0)
        del row["predicted_probe_only_jct_s"], row["measured_over_probe_only"]
    assert restamp(older) == now


def test_without_oracle_engine_seconds_the_bench_prediction_keeps_the_probed_slowdowns():
    doc, cap = _bench(None)
    add_predictions(doc, cap, {}, [], 8.0, {"oracle": AGENTS})
    assert (doc["prediction"]["rates"]["corun_prefill_slow"], doc["prediction"]["rates"]["corun_decode_slow"]) == (
        1.1, 1.2)
    assert doc["prediction"]["corun_by_repeat"] == {"0": [1.1, 1.2]}
