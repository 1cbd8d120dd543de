"""The bench's prediction takes the data-plane bandwidth its run measured, under the key the transport bench
writes, and the co-run slowdowns its oracle runs' engines measured where those exceed the probe's."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from dualpath.bench.predict import DEFAULT_DATA_PLANE, add_predictions, data_plane_bytes_s, rates
from dualpath.bench.repredict import busy_s
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


def _bench(measured: tuple[float, float] | None) -> tuple[dict, SimpleNamespace]:
    rows = [{"mode": "oracle", "kind": "offline", "jct_s": 9.0}]
    if measured:
        rows[0]["usage"] = {"prefill_s": {"p0-e0": measured[0]}, "decode_s": {"d1-e0": measured[1]}}
    cap = SimpleNamespace(rates=PROBE, prefill_nodes=1, decode_nodes=1, cores=2)
    return {"config": {"block_size": 16, "kv_bytes_per_block": 16000.0}, "runs": rows}, cap


def test_the_bench_prediction_raises_the_probed_slowdowns_to_what_its_oracle_runs_measured():
    doc, cap = _bench(None)
    probed = rates(doc, cap, {}, [], 8.0)
    truth = replace(probed, corun_prefill_slow=1.5, corun_decode_slow=1.8)
    doc, cap = _bench(busy_s(truth, AGENTS, "oracle"))
    add_predictions(doc, cap, {}, [], 8.0, {"oracle": AGENTS})
    got = doc["prediction"]["rates"]
    assert got["corun_prefill_slow"] == pytest.approx(1.5, rel=0.02)
    assert got["corun_decode_slow"] == pytest.approx(1.8, rel=0.02)
    assert doc["prediction"]["probe"]["corun_decode_slow"] == 1.2  # the probe's own figure is kept
    assert doc["runs"][0]["predicted_jct_s"] == pytest.approx(simulate(truth, AGENTS, "oracle").jct_s, rel=0.03)


def test_without_oracle_engine_seconds_the_bench_prediction_keeps_the_probed_slowdowns():
    doc, cap = _bench(None)
    add_predictions(doc, cap, {}, [], 8.0, {"oracle": AGENTS})
    assert (doc["prediction"]["rates"]["corun_prefill_slow"], doc["prediction"]["rates"]["corun_decode_slow"]) == (
        1.1, 1.2)
