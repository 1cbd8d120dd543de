"""Simulator building blocks: links, decode aggregation, traffic table, P/D window."""
import pytest

from dualpath.sim.collectives import Layout
from dualpath.sim.decode import DecodeState
from dualpath.sim.hardware import HARDWARE
from dualpath.sim.models import build_model
from dualpath.sim.resources import Link, transfer
from dualpath.sim.traffic import link_bytes
from dualpath.sim.window import closed_form, crossing, utilisation
from shared.sched.policy import ReadPath

pytestmark = pytest.mark.unit


def test_link_is_a_fifo_server_and_transfer_ends_at_the_slowest_hop():
    a, b = Link("a", 100.0), Link("b", 50.0)
    assert a.reserve(0.0, 100) == 1.0
    assert a.reserve(0.5, 100) == 2.0  # queued behind the first
    assert a.reserve(5.0, 100) == 6.0  # idle link starts now
    assert transfer(10.0, [(Link("c", 100.0), 100), (b, 100)]) == 12.0
    assert a.utilisation(6.0) == pytest.approx(0.5)


def test_traffic_table_reproduces_the_section4_link_sums():
    tp, tc = link_bytes(ReadPath.PE, 1, 0), link_bytes(ReadPath.DE, 1, 0)
    assert (tp[("pe", "cnic_r")], tc.get(("pe", "cnic_r"), 0)) == (2, 0)
    assert (tp[("pe", "cnic_w")], tc[("pe", "cnic_w")]) == (1, 1)
    assert (tp[("de", "cnic_r")], tc[("de", "cnic_r")]) == (1, 2)
    assert (tp[("de", "cnic_w")], tc[("de", "cnic_w")]) == (2, 1)
    assert (tp[("de", "dram")], tc[("de", "dram")]) == (2, 3)


@pytest.mark.parametrize("hw", list(HARDWARE.values()), ids=list(HARDWARE))
def test_numeric_window_matches_closed_form(hw):
    for link, bound in closed_form(hw).items():
        assert crossing(hw, link) == pytest.approx(bound, rel=1e-6)
    assert utilisation(hw, 1.0)["pe.cnic_r"] == pytest.approx(2 * hw.s / hw.gpus)


def test_decode_aggregation_finishes_in_order_with_exact_context():
    m = build_model("ds-27b", HARDWARE["h800"])
    d = DecodeState(m)
    d.join(0.0, 1, "a", prompt=1000, todo=10)
    step_one = d.step_s
    d.join(0.0, 2, "b", prompt=2000, todo=5)
    assert d.step_s >= step_one  # more KV to read per step
    assert d.ctx_base + d.n * d.steps == pytest.approx(1001 + 2001)
    t_b = d.next_finish()
    assert d.pop_finished(t_b - 1e-6) == []
    assert d.pop_finished(t_b) == ["b"]
    d.advance(d.t_last + 2 * d.step_s)
    assert d.ctx_base + d.n * d.steps == pytest.approx(1001 + 5 + 2)
    assert d.pop_finished(d.next_finish()) == ["a"] and d.n == 0


def test_model_presets_have_sane_numbers():
    hw = HARDWARE["h800"]
    ds, qw = build_model("ds-v3.2-660b", hw), build_model("qwen2.5-32b", hw)
    assert 30_000 < ds.kv_bytes < 60_000 and qw.kv_bytes == 262_144  # FP8 MLA vs BF16 GQA
    assert ds.moe and not qw.moe and ds.topk == 2048
    ds32 = build_model("ds-v3.2-660b", hw, de=Layout(4, 8))  # decode EP32, as the paper's 2P4D
    assert ds32.kv_capacity_tokens() > 100_000
    assert 0.005 < ds32.decode_compute_s(64, 64 * 30000, 64 * 2048) < 0.1
