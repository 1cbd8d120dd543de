"""`dualpath sim --ablation`: the paper's ablation, one technique added at a time, as JCT change.

Basic, then + layerwise prefill, + dual-path loading, + the scheduler; each row beside the
published change.
"""
from __future__ import annotations

from dataclasses import replace

from dualpath.sim.config import SimConfig
from shared.messages.codes import LoadMode

PUBLISHED = (None, -17.21, -38.19, -45.62)  # % JCT change from Basic, 660B, 64K
# Free HBM per prefill GPU (GB) at which "+ layerwise prefill" reaches the published -17.21%, found at full
# scale (2,000 agents) by running Basic at a few caps (`--pe-free-hbm`) against "+ layerwise" (5116 s):
# HBM_SWEEP's (GB, Basic JCT s), then linear interpolation between 1.15 and 2.0 GB to 5116 / (1 - 0.1721) s.
SWEEP_LAYERWISE_S = 5116.0
HBM_SWEEP = ((9.16, 5130.0), (2.0, 5870.0), (1.15, 6389.0), (0.001, 6596.0))  # 9.16: physical; 0.001: 1 req/batch
CLOSING_PE_FREE_HBM_GB = 1.5
STEPS = (
    ("Basic", dict(mode=LoadMode.BASIC, layerwise=False, assign="rr")),
    ("+ layerwise prefill", dict(mode=LoadMode.BASIC, layerwise=True, assign="rr")),
    ("+ dual-path loading", dict(mode=LoadMode.DUALPATH, layerwise=True, assign="rr")),
    ("+ scheduler", dict(mode=LoadMode.DUALPATH, layerwise=True, assign="policy")),
)


def configs(base: SimConfig) -> list[tuple[str, SimConfig]]:
    return [(name, replace(base, **kw)) for name, kw in STEPS]


def base_config(quick: bool, pe_free_hbm_gb: float = 0.0) -> SimConfig:
    return SimConfig(model="ds-v3.2-660b", P=2, D=4, trace="gen:64k", agents=400 if quick else 2000,
                     scale=0.25 if quick else 1.0, pe_free_hbm_gb=pe_free_hbm_gb)


def rows(jcts: list[float]) -> list[tuple[str, float, float, float | None]]:
    """(step, JCT s, change from Basic %, published %)."""
    first = jcts[0]
    return [(name, j, (j / first - 1) * 100, pub) for (name, _), j, pub in zip(STEPS, jcts, PUBLISHED)]


def format_rows(table: list[tuple[str, float, float, float | None]]) -> str:
    out = [f"{'ablation (offline JCT)':24} {'JCT s':>8} {'change':>9} {'published':>10} {'gap':>8}"]
    for name, jct, change, pub in table:
        pub_s = "-" if pub is None else f"{pub:+.2f}%"
        gap = "" if pub is None else f"{change - pub:+.1f} pt"
        out.append(f"{name:24} {jct:8.0f} {change:+8.2f}% {pub_s:>10} {gap:>8}")
    return "\n".join(out)


def main(quick: bool = False, run=None, pe_free_hbm_gb: float = 0.0) -> list[tuple[str, float, float, float | None]]:
    from dualpath.sim.engine import run_sim

    run = run or run_sim
    jcts = []
    for name, cfg in configs(base_config(quick, pe_free_hbm_gb)):
        r = run(cfg)
        cap = r.hbm_cap
        hbm = (f" (HBM holds {cap['tokens']:,.0f} KV tokens per prefill GPU, {cap['gb']:.1f} GB: it cut "
               f"{cap['cut_share']:.0%} of {cap['steps']:.0f} steps)") if cap else ""
        print(f"  {name}: JCT {r.jct_s:.0f} s{hbm}", flush=True)
        jcts.append(r.jct_s)
    table = rows(jcts)
    print(format_rows(table))
    return table
