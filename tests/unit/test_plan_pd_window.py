"""The P/D window: each of its five bounds alone, and the paper's own worked window.

Every bound gets inputs where it alone binds (s != 1 wherever s could hide a slip in
its formula) and an exact value; the binding link's load is then exactly one.
"""
from __future__ import annotations

import pytest

from dualpath.plan import pd

pytestmark = pytest.mark.unit

LINKS = ("PE CNIC read", "PE CNIC write", "DE CNIC read", "DE CNIC write", "DE DRAM")


def upper(w: pd.PDWindow, link: str) -> float:
    return {b.link: b.ratio for b in w.uppers}[link]


def assert_binds_alone(inp: pd.PDInputs, link: str, ratio: float) -> None:
    """`link` gives the window's upper end `ratio`, no other upper bound ties, and at that
    ratio its load is exactly its capacity while every other link is under its own."""
    w = pd.window(inp)
    assert w.feasible and w.upper.link == link and w.upper.ratio == ratio
    assert [b.link for b in w.binding] == [link]
    loads = pd.link_loads(inp, ratio)
    assert loads[link] == pytest.approx(1.0, abs=1e-12)
    assert all(v < 1 for k, v in loads.items() if k != link)


def test_pe_cnic_read_needs_twice_the_snic_at_most_g():
    edge = pd.PDInputs(gpus_per_node=8, snic=4, cnic_gbs=50, dram_gbs=10_000)
    assert pd.window(edge).pe_read_ok
    assert pd.link_loads(edge, 1.0)["PE CNIC read"] == 1.0  # 2s/g = 8/8, whatever P/D
    over = pd.window(pd.PDInputs(gpus_per_node=8, snic=4.5, cnic_gbs=50, dram_gbs=10_000))
    assert not over.pe_read_ok and not over.feasible and over.examples == ()
    assert pd.link_loads(over.inputs, 1.0)["PE CNIC read"] == pytest.approx(9 / 8)


def test_pe_cnic_write_gives_the_lower_end_s_over_g_minus_s():
    inp = pd.PDInputs(gpus_per_node=8, snic=2, cnic_gbs=50, dram_gbs=10_000)
    w = pd.window(inp)
    assert w.lower.link == "PE CNIC write" and w.lower.ratio == 2 / 6
    assert pd.link_loads(inp, 2 / 6)["PE CNIC write"] == pytest.approx(1.0, abs=1e-12)
    assert pd.link_loads(inp, 0.3)["PE CNIC write"] > 1 > pd.link_loads(inp, 0.4)["PE CNIC write"]
    assert pd.window(pd.PDInputs(4, 4, 50, 10_000)).lower.ratio == float("inf")  # g <= s: none


def test_de_cnic_read_binds_at_g_minus_2s_over_s():
    # g/3 < s <= g/2 puts the read bound under the write bound: 2/3 < 5/6, lower end 3/5
    inp = pd.PDInputs(gpus_per_node=8, snic=3, cnic_gbs=50, dram_gbs=10_000)
    assert_binds_alone(inp, "DE CNIC read", 2 / 3)
    assert upper(pd.window(inp), "DE CNIC write") == 5 / 6
    assert pd.window(inp).lower.ratio == 3 / 5


def test_de_cnic_write_binds_at_g_minus_s_over_2s():
    inp = pd.PDInputs(gpus_per_node=16, snic=2, cnic_gbs=50, dram_gbs=10_000)
    assert_binds_alone(inp, "DE CNIC write", 14 / 4)
    assert upper(pd.window(inp), "DE CNIC read") == 12 / 2


def test_de_dram_binds_at_m_over_bs_minus_3_over_2():
    # M/(B*s) = 600/(50*2) = 6 -> (6 - 3)/2 = 1.5, under read 6 and write 3.5
    inp = pd.PDInputs(gpus_per_node=16, snic=2, cnic_gbs=50, dram_gbs=600)
    assert_binds_alone(inp, "DE DRAM", 1.5)
    assert pd.link_loads(inp, 1.5)["DE DRAM"] == pytest.approx(1.0, abs=1e-12)


def test_empty_window_when_the_lower_end_passes_the_upper():
    w = pd.window(pd.PDInputs(gpus_per_node=8, snic=1, cnic_gbs=50, dram_gbs=160))
    assert w.upper.link == "DE DRAM" and w.upper.ratio == pytest.approx(0.1)  # (3.2 - 3)/2
    assert w.pe_read_ok and w.lower.ratio == 1 / 7 and not w.feasible and w.examples == ()
    with pytest.raises(ValueError, match="snic"):
        pd.PDInputs(8, 0, 50, 400)


def test_the_papers_window_g8_s1_m500_bs50_is_one_seventh_to_seven_halves():
    # the paper: g = 8, s = 1, M ~ 500 GB/s, B*s ~ 50 GB/s -> 1/7 <= P/D <= 7/2
    inp = pd.PDInputs(gpus_per_node=8, snic=1, cnic_gbs=50, dram_gbs=500)
    w = pd.window(inp)
    assert w.pe_read_ok and w.feasible
    assert w.lower.link == "PE CNIC write" and w.lower.ratio == 1 / 7
    assert {b.link: b.ratio for b in w.uppers} == {"DE CNIC read": 6.0, "DE CNIC write": 3.5,
                                                   "DE DRAM": 3.5}
    assert w.upper.ratio == 7 / 2 and [b.link for b in w.binding] == ["DE CNIC write", "DE DRAM"]
    top, bottom = pd.link_loads(inp, 7 / 2), pd.link_loads(inp, 1 / 7)
    assert top["DE CNIC write"] == pytest.approx(1.0, abs=1e-12)
    assert top["DE DRAM"] == pytest.approx(1.0, abs=1e-12)
    assert bottom["PE CNIC write"] == pytest.approx(1.0, abs=1e-12)
    assert set(LINKS) == set(top) and max(pd.link_loads(inp, 1.0).values()) < 1


def test_the_papers_evaluated_node_ratios_sit_inside_its_window():
    w = pd.window(pd.PDInputs(gpus_per_node=8, snic=1, cnic_gbs=50, dram_gbs=500))
    for p, d in ((1, 1), (2, 1), (1, 2), (2, 4), (48, 96), (44, 88)):
        assert w.lower.ratio <= p / d <= w.upper.ratio
    assert {"1P2D", "1P1D", "2P1D", "3P1D"} <= set(w.examples) and "4P1D" not in w.examples


PAPER = pd.PDInputs(gpus_per_node=8, snic=1, cnic_gbs=50, dram_gbs=500)


def test_examples_list_every_reduced_ratio_once_in_order():
    assert pd.window(PAPER).examples == ("1P4D", "1P3D", "1P2D", "2P3D", "3P4D", "1P1D", "4P3D", "3P2D",
                                         "2P1D", "3P1D")
    wide = pd.window(PAPER, max_nodes=8).examples
    assert wide[:3] == ("1P7D", "1P6D", "1P5D") and wide[-1] == "7P2D"  # 7/2 is the upper end itself
    assert len(wide) == len(set(wide)) == 37


def test_a_window_of_one_point_is_feasible():
    # lower s/(g-s) = 2/4 and DRAM (400/(50*2) - 3)/2 = 1/2: the window is exactly P/D = 1/2
    w = pd.window(pd.PDInputs(gpus_per_node=6, snic=2, cnic_gbs=50, dram_gbs=400))
    assert w.lower.ratio == w.upper.ratio == 0.5 and w.feasible and w.examples == ("1P2D",)


def test_an_empty_window_lists_nothing_even_within_the_rounding_slack():
    # the upper end falls 5e-14 under the lower: empty, though 1/2 is within the 1e-12 slack
    w = pd.window(pd.PDInputs(gpus_per_node=6, snic=2, cnic_gbs=50, dram_gbs=399.99999999999))
    assert w.upper.ratio < w.lower.ratio == 0.5 and not w.feasible and w.examples == ()


@pytest.mark.parametrize(("inp", "lower", "upper", "examples"), [
    # inputs found so that an end plus/minus the 1e-12 slack is exactly a node ratio
    (pd.PDInputs(3, 0.60000000000024, 50, 10_000), 0.25, 2.0, ("1P4D", "2P1D")),
    (pd.PDInputs(9, 3.000000000004, 50, 10_000), 0.5, 1.0, ("1P2D", "3P4D")),
])
def test_ratios_within_the_slack_of_an_end_count(inp, lower, upper, examples):
    w = pd.window(inp)
    assert w.lower.ratio - 1e-12 == lower or w.upper.ratio + 1e-12 == upper
    assert (w.examples[0], w.examples[-1]) == examples


def test_a_tiny_snic_never_offers_zero_prefill_nodes():
    w = pd.window(pd.PDInputs(gpus_per_node=8, snic=1e-13, cnic_gbs=50, dram_gbs=10_000))
    assert w.lower.ratio < 1e-12 and w.examples[0] == "1P4D" and w.examples[-1] == "4P1D"
