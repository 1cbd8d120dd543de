"""The simulator's one fitted input: the share of the kernels' rates each engine kind reaches.

Their ratio is DeepSeek's production service's (`models.end_to_end`); one common scale is fitted
(`fit`, run by `dualpath sim --fit-efficiency`) to one published figure: DualPath's offline JCT at
2P4D with 2,000 agents close to Oracle's, read as within FIT_TARGET. All else is predicted.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from shared.messages.codes import LoadMode

# Fitted by `dualpath sim --fit-efficiency` (the scale below times the production shares).
SCALE = 1.5546
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
    """(prefill, decode) efficiency at `scale` times the production shares, each at most 1, rounded as kept."""
    return min(1.0, round(PROD_PREFILL * scale, 4)), min(1.0, round(PROD_DECODE * scale, 4))


def fit(jct: Callable[[str, float, float], float], lo: float = 1.0, hi: float = 1 / PROD_DECODE,
        iters: int = 6, target: float = FIT_TARGET, say: Callable[[str], None] = print) -> tuple[float, list[FitPoint]]:
    """The largest scale in [lo, hi] whose dualpath/oracle JCT stays within `target`, by bisection.

    `jct(mode, prefill_eff, decode_eff)` runs the fitted row. Faster engines leave storage a larger
    share of each turn, so the ratio grows with the scale. Returns (scale, the points tried).
    """
    points: list[FitPoint] = []

    def at(s: float) -> FitPoint:
        p, d = effs(s)
        pt = FitPoint(s, jct(LoadMode.DUALPATH, p, d), jct(LoadMode.ORACLE, p, d))
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
