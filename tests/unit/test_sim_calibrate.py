"""The simulator fitted to a mesh's probed rates predicts a bench run; the bench report shows it beside measured."""
import pytest

from dualpath.bench.predict import add_predictions, thresholds
from dualpath.bench.report import markdown
from dualpath.sim.calibrate import MeshRates, predict

pytestmark = pytest.mark.unit

RATES = MeshRates(prefill_tok_s=2000.0, turn_overhead_s=0.05, decode_step_s=0.01, decode_per_seq_s=0.002,
                  snic_bytes_s=1e6, data_plane_bytes_s=1e9, kv_bytes_per_token=1000.0, block_tokens=16,
                  prefill_nodes=1, decode_nodes=1, kv_tokens_per_engine=100_000, alpha_tokens=50_000,
                  beta_tokens=4096)


def test_one_agent_costs_what_its_turns_add_up_to():
    turns = [(320, 4), (160, 4)]  # turn 2 has 320 + 4 = 324 tokens before it: 320 stored (20 blocks of 16)
    got = predict(RATES, [turns], ["oracle", "basic"], write_lag=False)
    compute = (320 + (160 + 4 + 4)) / 2000 + 2 * 3 * 0.01  # prefill of both turns + 3 decode steps each
    assert got["oracle"] == pytest.approx(compute + 2 * 0.05, rel=0.05)  # + each turn's fixed cost in its forward
    read = 320 * 1000 / 1e6  # the second turn's stored KV through the storage NIC
    assert got["basic"] - got["oracle"] == pytest.approx(read, rel=0.1)


def test_a_turn_hits_only_the_blocks_its_predecessor_has_written():
    # turn 1's 20 blocks take 0.32 s through the 1 MB/s storage NIC; turn 2 comes at once:
    # nothing is stored yet, so basic computes the 320 tokens again instead of reading them
    turns = [(320, 4), (160, 4)]
    got = predict(RATES, [turns], ["oracle", "basic"])
    assert got["basic"] - got["oracle"] == pytest.approx(320 / 2000, rel=0.1)
    slow = MeshRates(**{**vars(RATES), "turn_overhead_s": 1.0})  # 1 s between turns: all written by then
    got = predict(slow, [turns], ["oracle", "basic"], forward_share=0.5)
    assert got["basic"] - got["oracle"] == pytest.approx(320 * 1000 / 1e6, rel=0.1)


def test_two_storage_nics_halve_a_storage_bound_run():
    agents = [[(2000, 2)] + [(16, 2)] * 6 for _ in range(6)]
    got = predict(RATES, agents, ["basic", "dualpath"])
    assert got["basic"] / got["dualpath"] == pytest.approx(2.0, rel=0.2)


def test_thresholds_come_from_the_scheduler_settings():
    assert thresholds([]) == (50_000, 4_096)
    assert thresholds([("scheduler", "pe-beta-tokens", "32768")]) == (50_000, 32_768)


class Cap:
    prefill_nodes = decode_nodes = 1
    rates = {"prefill_tok_s": 2000.0, "turn_overhead_s": 0.05, "decode_step_s": 0.01, "decode_per_seq_s": 0.002}


def test_the_bench_report_puts_the_prediction_beside_the_measured_jct():
    doc = {"trace": "t", "config": {"block_size": 16, "kv_bytes_per_block": 16_000},
           "runs": [{"mode": m, "kind": "offline", "jct_s": j, "storage_read_bytes_per_node": {}, "hit_ratio": 0.9,
                     "turns": 2, "errors": 0} for m, j in (("basic", 2.0), ("oracle", 1.0))]}
    turns = {"basic": [[(320, 4), (160, 4)]], "oracle": [[(320, 4), (160, 4)]]}
    add_predictions(doc, Cap(), {"engines": [{"role": "decode", "total_blocks": 100}]}, [], 0.008, turns)
    for row in doc["runs"]:
        assert row["predicted_jct_s"] > 0 and row["measured_over_predicted"] == row["jct_s"] / row["predicted_jct_s"]
    text = markdown(doc)
    assert "simulator's prediction s" in text and "probed: prefill 2000 tok/s" in text


def test_without_a_probe_there_is_no_prediction():
    doc = {"config": {"block_size": 16, "kv_bytes_per_block": 16_000},
           "runs": [{"mode": "basic", "kind": "offline", "jct_s": 2.0}]}
    cap = Cap()
    cap.rates = None
    add_predictions(doc, cap, {}, [], 0.0, {"basic": [[(10, 2)]]})
    assert doc["runs"][0]["predicted_jct_s"] is None


def test_a_decode_step_costs_what_the_probe_saw_and_more_behind_a_longer_context():
    from dualpath.sim.calibrate import mesh_model

    r = MeshRates(**{**vars(RATES), "decode_per_ctx_s": 1e-5, "decode_probe_ctx": 100})
    m = mesh_model(r)
    assert m.decode_compute_s(1, 100, 0) == pytest.approx(r.decode_step_s)  # as probed: one stream at its context
    assert m.decode_compute_s(1, 1100, 0) == pytest.approx(r.decode_step_s + 1000 * 1e-5)
    assert m.decode_compute_s(4, 400, 0) == pytest.approx(r.decode_step_s + 3 * r.decode_per_seq_s)
    assert mesh_model(RATES).decode_compute_s(4, 4000, 0) == pytest.approx(0.01 + 3 * 0.002)  # none probed: none
