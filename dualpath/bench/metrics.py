"""Numbers from turn results: percentiles, JCT, hit ratio, SLO attainment, the APS search.

Pure: takes TurnResult-like values, returns dicts and floats. A turn meets the SLO when
its TTFT <= slo.ttft_s and its TPOT <= slo.tpot_s (a one-token turn has no TPOT and is
judged by TTFT alone); a failed turn never meets it.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float = 4.0
    tpot_s: float = 0.050
    target: float = 0.9  # attainment an APS needs to count as "meets the SLO"


def percentile(values: Iterable[float], q: float) -> float:
    """Linear-interpolated q-th percentile (0..100) of the finite values; nan when none."""
    xs = sorted(v for v in values if v == v and not math.isinf(v))
    if not xs:
        return float("nan")
    pos = (len(xs) - 1) * q / 100.0
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def meets(turn, slo: Slo) -> bool:
    if turn.error or not turn.ttft <= slo.ttft_s:
        return False
    tpot = turn.tpot
    return tpot != tpot or tpot <= slo.tpot_s


def summarise(run, slo: Slo) -> dict:
    """The per-run numbers of the JSON report (times in seconds)."""
    ok = [t for t in run.turns if not t.error]
    prompt = sum(t.prompt_tokens for t in ok)
    out = {
        "mode": run.mode, "kind": run.kind, "aps": run.aps,
        "turns": len(run.turns), "errors": len(run.turns) - len(ok),
        "jct_s": max(run.job_ends.values(), default=0.0) if run.kind == "offline" else None,
        "wall_s": run.wall_s,
        "hit_ratio": (sum(t.cached_tokens for t in ok) / prompt) if prompt else 0.0,
        "prompt_tokens": prompt, "cached_tokens": sum(t.cached_tokens for t in ok),
        "gen_tokens": sum(t.gen_tokens for t in ok),
        "error_samples": sorted({t.error for t in run.turns if t.error})[:3],
    }
    for name, key in (("ttft", "ttft"), ("ttst", "ttst"), ("tpot", "tpot")):
        vals = [getattr(t, key) for t in ok]
        for q in (50, 90, 99):
            out[f"{name}_p{q}_s"] = percentile(vals, q)
    out["slo_attainment"] = (sum(meets(t, slo) for t in run.turns) / len(run.turns)) if run.turns else 0.0
    out["slo"] = {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "target": slo.target}
    return out


class ApsSearch:
    """The highest APS that meets the SLO: grow by `factor` until a level fails, then bisect
    geometrically. Stepwise (`next` / `record`) so the CLI can interleave several modes'
    searches level by level; `best` is 0.0 when even `start` fails.
    """

    def __init__(self, start: float, factor: float = 2.0):
        self.good, self.bad, self.aps, self.factor = 0.0, math.inf, start, factor
        self.history: list[tuple[float, bool]] = []

    def next(self) -> float:
        return self.aps

    def record(self, aps: float, ok: bool) -> None:
        self.history.append((aps, ok))
        if ok:
            self.good = max(self.good, aps)
        else:
            self.bad = min(self.bad, aps)
        if self.bad == math.inf:
            self.aps = self.good * self.factor
        elif self.good == 0.0:
            self.aps = self.bad / self.factor
        else:
            self.aps = math.sqrt(self.good * self.bad)

    @property
    def best(self) -> float:
        return self.good
