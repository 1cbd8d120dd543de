"""The one fitted input of the simulator: what share of the kernels' rates a whole engine reaches.

Everything else in the compute model comes from the architecture and published kernel rates
(`dualpath.sim.models.Rates`). Two efficiencies scale those rates, one per engine kind. Their
ratio is DeepSeek's published production service's (`models.end_to_end`: 73.7k input tokens/s
per prefill node, 14.8k output tokens/s per decode node, on H800s); one scale, common to both,
is fitted by `fit` to one published figure of the paper: DualPath's offline JCT at 2P4D with
2,000 agents is close to Oracle's, read as within FIT_TARGET. Every other row of
`dualpath sim --reproduce` is then a prediction. `dualpath sim --fit-efficiency` reruns the fit.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

# Fitted by `dualpath sim --fit-efficiency` (the scale below times the production shares).
SCALE = 1.0
PROD_PREFILL = 0.339  # models.end_to_end(Rates(), h800), rounded; a unit test checks them
PROD_DECODE = 0.441
PREFILL_EFF = round(PROD_PREFILL * SCALE, 4)
DECODE_EFF = round(PROD_DECODE * SCALE, 4)

FIT_TARGET = 1.10  # dualpath JCT / oracle JCT the fit reads "close to Oracle" as
FIT_AGENTS = 2000


@dataclass(frozen=True)
class FitPoint:
    scale: float
    dualpath_s: float
    oracle_s: float

    @property
    def ratio(self) -> float:
        return self.dualpath_s / self.oracle_s


def effs(scale: float) -> tuple[float, float]:
    """(prefill, decode) efficiency at `scale` times the production shares, each at most 1."""
    return min(1.0, PROD_PREFILL * scale), min(1.0, PROD_DECODE * scale)


def fit(jct: Callable[[str, float, float], float], lo: float = 1.0, hi: float = 1 / PROD_DECODE,
        iters: int = 6, target: float = FIT_TARGET, say: Callable[[str], None] = print) -> tuple[float, list[FitPoint]]:
    """The largest scale in [lo, hi] whose dualpath/oracle JCT stays within `target`, by bisection.

    `jct(mode, prefill_eff, decode_eff)` runs the fitted row. Faster engines leave storage a larger
    share of each turn, so the ratio grows with the scale. Returns (scale, the points tried).
    """
    points: list[FitPoint] = []

    def at(s: float) -> FitPoint:
        p, d = effs(s)
        pt = FitPoint(s, jct("dualpath", p, d), jct("oracle", p, d))
        points.append(pt)
        say(f"  scale {s:.3f} (prefill {p:.3f}, decode {d:.3f}): dualpath {pt.dualpath_s:.0f} s, "
            f"oracle {pt.oracle_s:.0f} s, ratio {pt.ratio:.3f}")
        return pt

    if at(lo).ratio > target:
        return lo, points  # even the production shares leave dualpath further than target: say so
    if at(hi).ratio <= target:
        return hi, points
    for _ in range(iters):
        mid = (lo + hi) / 2
        if at(mid).ratio <= target:
            lo = mid
        else:
            hi = mid
    return lo, points


def main(agents: int = FIT_AGENTS) -> int:
    """Run the fit on the paper's 2P4D DS-660B offline row and print the constants to keep."""
    from dataclasses import replace

    from dualpath.sim.config import SimConfig
    from dualpath.sim.engine import run_sim

    base = SimConfig(model="ds-v3.2-660b", P=2, D=4, trace="gen:64k", agents=agents)
    print(f"fitting the engines' efficiency: DS-660B 2P4D, {agents} agents offline, dualpath/oracle JCT "
          f"<= {FIT_TARGET} (production shares prefill {PROD_PREFILL}, decode {PROD_DECODE})", flush=True)
    scale, _ = fit(lambda m, p, d: run_sim(replace(base, mode=m, prefill_eff=p, decode_eff=d)).jct_s,
                   say=lambda s: print(s, flush=True))
    p, d = effs(scale)
    print(f"fitted: SCALE = {scale:.4f} -> PREFILL_EFF {p:.4f}, DECODE_EFF {d:.4f} (dualpath/sim/efficiency.py)")
    return 0
