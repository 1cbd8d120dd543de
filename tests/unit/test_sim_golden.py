"""The simulator's figures on small fixed runs, pinned: a speed-up must leave every result as it was.

The pinned values were produced by the simulator before its speed work (main at 1341cec);
a change that is meant to alter results (the model, the policy, the trace generator)
updates them on purpose, with the reason in its commit. The attention-balance split
(`prefill.AttnBalance`) is checked on a hand-built step.
"""
import pytest

from dualpath.sim.config import SimConfig
from dualpath.sim.engine import run_sim
from dualpath.sim.prefill import AttnBalance

pytestmark = pytest.mark.unit

# DS-660B 2P4D, 64K trace, a quarter of the lengths, on the kernels' own rates (the figures
# predate the fitted efficiencies; FITTED pins one run at them)
SMALL = dict(agents=60, scale=0.25, prefill_eff=1.0, decode_eff=1.0)
PINNED = {  # (mode, assign, read_near_tie): figures; re-pinned when the copy into HBM became an event
    ("dualpath", "policy", 0.5): dict(jct_s=137.1284020067582, requests=7431, events=38282,
                                      ttft_p50_s=0.0625720483678478, tpot_p50_s=0.02137887833960162,
                                      attn_max_over_avg=3.377465043243234, snic_max_over_avg=1.6839348613591973),
    ("dualpath", "policy", 0.0): dict(jct_s=136.9784020067582, requests=7431, events=38502,
                                 ttft_p50_s=0.06224859693142548, tpot_p50_s=0.02137852493502636,
                                 attn_max_over_avg=3.2826827805920145, snic_max_over_avg=2.038126220723503),
    ("basic", "policy", 0.5): dict(jct_s=137.3956501074673, requests=7431, events=40349,
                              ttft_p50_s=0.06455168078885976, tpot_p50_s=0.02137823160898833,
                              attn_max_over_avg=3.417930881818401, snic_max_over_avg=3.0049955761814933),
    ("sglang", "policy", 0.5): dict(jct_s=139.04464317037926, requests=7431, events=37818,
                               ttft_p50_s=0.08097051287920465, tpot_p50_s=0.021385530933169684,
                               attn_max_over_avg=2.238821160274592, snic_max_over_avg=3.006410363420864),
    ("dualpath-split", "rr", 0.5): dict(jct_s=136.8456501074673, requests=7431, events=38175,
                                   ttft_p50_s=0.06264711682359803, tpot_p50_s=0.02138711870353457,
                                   attn_max_over_avg=1.957131599098706, snic_max_over_avg=1.5086452264494266),
}


@pytest.mark.parametrize("mode,assign,near", list(PINNED))
def test_small_run_matches_pinned_figures(mode, assign, near):
    r = run_sim(SimConfig(mode=mode, assign=assign, read_near_tie=near, **SMALL)).to_dict()
    want = PINNED[(mode, assign, near)]
    got = {k: r[k] for k in want}
    assert got == pytest.approx(want, rel=1e-12, abs=0)  # events and requests: exact (ints)


def test_attention_balance_keeps_cut_steps_apart():
    b = AttnBalance()
    b.add(0.30, 0.30 * 3 + 0.29, 4, cut=True, step=0.5)  # quota-cut on every GPU: 0.30 vs mean 0.2975
    b.add(0.20, 0.20 + 0.05 * 3, 4, cut=False, step=0.4)  # one GPU had more ready work than the rest
    f = b.figures()
    assert f["steps"] == 2 and f["cut_share"] == 0.5
    assert f["cut_ratio"] == pytest.approx(0.30 / 0.2975)
    assert f["uncut_ratio"] == pytest.approx(0.20 / 0.0875)
    assert f["ratio"] == pytest.approx((0.30 / 0.2975 + 0.20 / 0.0875) / 2)
    assert f["wait_share"] == pytest.approx(((0.30 - 0.2975) + (0.20 - 0.0875)) / 0.9)


FITTED = dict(jct_s=191.9897387576474, requests=7431, events=38801, ttft_p50_s=0.07621085011714968,
              tpot_p50_s=0.030264985306854442, attn_max_over_avg=3.4248359588347173,
              snic_max_over_avg=1.609689831894897)


def test_small_run_at_the_fitted_efficiencies_matches_pinned_figures():
    """The defaults (dualpath/sim/efficiency.py): a refit changes these on purpose."""
    r = run_sim(SimConfig(mode="dualpath", agents=60, scale=0.25)).to_dict()
    assert {k: r[k] for k in FITTED} == pytest.approx(FITTED, rel=1e-12, abs=0)
