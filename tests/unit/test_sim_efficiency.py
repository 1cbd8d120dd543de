"""The simulator's one fitted input: the engines' efficiency, its ratio from production, its fit."""
from __future__ import annotations

import pytest

from dualpath.sim import efficiency as eff
from dualpath.sim.config import SimConfig
from dualpath.sim.hardware import HARDWARE
from dualpath.sim.models import Rates, build_model, end_to_end
from dualpath.sim.reproduce import format_table


def test_production_shares_are_the_published_service_figures():
    p, d = end_to_end(Rates(), HARDWARE["h800"])
    assert (round(p, 3), round(d, 3)) == (eff.PROD_PREFILL, eff.PROD_DECODE)


def test_fitted_efficiencies_keep_the_production_ratio():
    assert eff.PREFILL_EFF / eff.DECODE_EFF == pytest.approx(eff.PROD_PREFILL / eff.PROD_DECODE, rel=1e-3)
    assert SimConfig().prefill_eff == eff.PREFILL_EFF and SimConfig().decode_eff == eff.DECODE_EFF


def test_efficiency_divides_the_kernel_rates():
    hw = HARDWARE["h800"]
    full = build_model("ds-27b", hw, rates=Rates())
    half = build_model("ds-27b", hw, rates=Rates(prefill_eff=0.5, decode_eff=0.25))
    assert half.linear_s_per_token == pytest.approx(2 * full.linear_s_per_token)
    assert half.attention.per_pair == pytest.approx(2 * full.attention.per_pair)
    assert half.d_gemm_s_per_token == pytest.approx(4 * full.d_gemm_s_per_token)
    assert half.d_overhead_s == full.d_overhead_s  # fixed costs are not rates


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.5])
def test_config_rejects_an_efficiency_outside_0_1(bad):
    with pytest.raises(ValueError, match="prefill_eff"):
        SimConfig(prefill_eff=bad)
    with pytest.raises(ValueError, match="decode_eff"):
        SimConfig(decode_eff=bad)


def _fake(edge: float):
    """dualpath/oracle grows with the scale and crosses the target at `edge`."""
    def jct(mode: str, p: float, d: float) -> float:
        s = p / eff.PROD_PREFILL
        return 100.0 * (1 + (eff.FIT_TARGET - 1) * s / edge) if mode == "dualpath" else 100.0
    return jct


def test_fit_finds_the_largest_scale_within_the_target():
    scale, points = eff.fit(_fake(1.7), iters=12, say=lambda s: None)
    assert scale == pytest.approx(1.7, rel=1e-3)
    assert all(p.ratio <= eff.FIT_TARGET for p in points if p.scale <= scale)


def test_fit_stops_at_the_bounds():
    assert eff.fit(_fake(0.5), say=lambda s: None)[0] == 1.0  # even the production shares miss: lo
    assert eff.fit(_fake(5.0), say=lambda s: None)[0] == pytest.approx(1 / eff.PROD_DECODE)


def test_quick_rows_are_marked_not_comparable():
    rows = [("A", "JCT speedup dualpath / basic", "up to 1.87x", 1.2, 1.87, "storage-bound")]
    full = format_table(rows)
    assert " *" in full and "storage-bound" in full
    quick = format_table(rows, comparable=False)
    assert "n/c" in quick and "not comparable" in quick and "storage-bound" not in quick and " *" not in quick
