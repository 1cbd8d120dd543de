"""CNICs shared by KV and the model's collectives: the 99:1 lanes, the volumes, and a run that shows both effects."""
from dataclasses import replace

import pytest

from dualpath.presets import load_arch
from dualpath.sim.collectives import Layout, cnic_bytes_per_token, remote_copies
from dualpath.sim.config import SimConfig
from dualpath.sim.engine import run_sim
from dualpath.sim.resources import LO_SHARE, Link

pytestmark = pytest.mark.unit


def test_kv_gets_what_the_model_lane_leaves_and_never_less_than_its_share():
    idle, shared, saturated = Link("a", 100.0), Link("b", 100.0), Link("c", 100.0)
    shared.set_model(0.0, 0.6)
    saturated.set_model(0.0, 1.0)
    assert idle.reserve(0.0, 100) == pytest.approx(1.0)
    assert shared.reserve(0.0, 100) == pytest.approx(1.0 / 0.4)  # 40% of the line is left for KV
    assert saturated.reserve(0.0, 100) == pytest.approx(1.0 / LO_SHARE)  # starved to the KV lane's 1%, not 0
    assert shared.kv_time / shared.busy == pytest.approx(2.5)


def test_a_model_burst_loses_at_most_the_kv_lanes_share():
    link = Link("a", 100.0)
    assert link.model_burst(0.0, 100) == pytest.approx(1.0)  # nothing queued: full rate
    link.reserve(0.0, 1000)  # KV queued until t=10
    assert link.model_burst(1.0, 100) == pytest.approx(1.0 / 0.99)
    assert link.hi_time / link.hi_ideal == pytest.approx((1 + 1 / 0.99) / 2)


def test_model_bytes_follow_the_planners_formula():
    ds = load_arch("ds-v3.2-660b")
    per_layer = ds.hidden * (1 + 4 / 128 + 2)  # FP8 dispatch with scales + BF16 combine
    decode = cnic_bytes_per_token(ds, Layout(4, 8), prefill=False)
    assert decode == pytest.approx(8 * 3 / 4 * per_layer * ds.num_moe_layers)  # k * (n-1)/n copies leave the node
    assert cnic_bytes_per_token(ds, Layout(1, 8), prefill=False) == 0.0  # one node: NVLink only
    assert remote_copies(8, 2, per_node=True) == pytest.approx(1 - 0.5 ** 8)  # once per remote node touched
    assert cnic_bytes_per_token(load_arch("qwen2.5-32b"), Layout(4, 8), prefill=False) == 0.0  # dense, DP only
    assert cnic_bytes_per_token(load_arch("qwen2.5-32b"), Layout(1, 8, attn_tp=16), prefill=False) > 0  # TP past a node


@pytest.fixture(scope="module")
def runs():
    cfg = SimConfig(model="ds-v3.2-660b", P=2, D=4, trace="gen:64k:20", agents=60, scale=0.25, mode="dualpath")
    return {k: run_sim(replace(cfg, model_traffic=k)) for k in (0.0, 1.0, 4.0)}


def test_heavy_model_traffic_slows_kv_and_not_itself(runs):
    none, normal, heavy = runs[0.0], runs[1.0], runs[4.0]
    assert none.lanes["d.cnic_r"]["model_gb"] == 0.0 and none.lanes["d.cnic_r"]["kv_slowdown"] == pytest.approx(1.0)
    assert heavy.lanes["d.cnic_r"]["model_gb"] > 3 * normal.lanes["d.cnic_r"]["model_gb"] > 0
    for lane in ("p.cnic_w", "d.cnic_r", "d.cnic_w"):
        assert heavy.lanes[lane]["kv_slowdown"] > normal.lanes[lane]["kv_slowdown"] > 1.0
    for r in runs.values():
        for v in r.lanes.values():
            assert v["model_slowdown"] <= 1 / (1 - LO_SHARE) + 1e-9  # the model lane keeps 99%
