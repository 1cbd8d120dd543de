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
PINNED = {  # (mode, assign, read_near_tie): figures; near-ties at 0.5 (2026-12-06) moved only dualpath's
    ("dualpath", "policy", 0.5): dict(jct_s=137.2284020067582, requests=7431, events=34315,
                                      ttft_p50_s=0.06302944308649927, tpot_p50_s=0.02137795893714589,
                                      attn_max_over_avg=3.408547396764158, snic_max_over_avg=1.6581494249035942),
    ("dualpath", "policy", 0.0): dict(jct_s=137.07840200675818, requests=7431, events=34289,
                                 ttft_p50_s=0.06283030226903463, tpot_p50_s=0.021378985248821356,
                                 attn_max_over_avg=3.4073570148865975, snic_max_over_avg=2.0131295594544514),
    ("basic", "policy", 0.5): dict(jct_s=138.0956501074673, requests=7431, events=34630,
                              ttft_p50_s=0.06480784670799267, tpot_p50_s=0.02137780791447739,
                              attn_max_over_avg=3.4212007790027155, snic_max_over_avg=3.0330158756656598),
    ("sglang", "policy", 0.5): dict(jct_s=139.10706491880006, requests=7431, events=33985,
                               ttft_p50_s=0.0808713876895979, tpot_p50_s=0.021385380711277453,
                               attn_max_over_avg=2.6888485538685054, snic_max_over_avg=3.002216082666978),
    ("dualpath-split", "rr", 0.5): dict(jct_s=136.8956501074673, requests=7431, events=34337,
                                   ttft_p50_s=0.06304767234573205, tpot_p50_s=0.02138665336929672,
                                   attn_max_over_avg=1.957131599098706, snic_max_over_avg=1.5030298983356425),
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
