"""`dualpath sim --ablation`: the paper's ablation, one technique added at a time, as JCT change.

Basic, then + layerwise prefill, + dual-path loading, + the scheduler; each row beside the
published change.
"""
from __future__ import annotations

from dataclasses import replace

from dualpath.sim.config import SimConfig
from shared.messages.codes import LoadMode

PUBLISHED = (None, -17.21, -38.19, -45.62)  # % JCT change from Basic, 660B, 64K
STEPS = (
    ("Basic", dict(mode=LoadMode.BASIC, layerwise=False, assign="rr")),
    ("+ layerwise prefill", dict(mode=LoadMode.BASIC, layerwise=True, assign="rr")),
    ("+ dual-path loading", dict(mode=LoadMode.DUALPATH, layerwise=True, assign="rr")),
    ("+ scheduler", dict(mode=LoadMode.DUALPATH, layerwise=True, assign="policy")),
)


def configs(base: SimConfig) -> list[tuple[str, SimConfig]]:
    return [(name, replace(base, **kw)) for name, kw in STEPS]


def base_config(quick: bool) -> SimConfig:
    return SimConfig(model="ds-v3.2-660b", P=2, D=4, trace="gen:64k", agents=400 if quick else 2000,
                     scale=0.25 if quick else 1.0)


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


def main(quick: bool = False, run=None) -> list[tuple[str, float, float, float | None]]:
    from dualpath.sim.engine import run_sim

    run = run or run_sim
    jcts = []
    for name, cfg in configs(base_config(quick)):
        r = run(cfg)
        print(f"  {name}: JCT {r.jct_s:.0f} s", flush=True)
        jcts.append(r.jct_s)
    table = rows(jcts)
    print(format_rows(table))
    return table
