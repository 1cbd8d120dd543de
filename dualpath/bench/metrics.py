"""Numbers from turn results: percentiles, JCT, hit ratio, SLO verdict, the APS search, medians.

A level holds the SLO when, after warm-up, mean TTFT and TPOT are within it, no turn failed and
the run was not stopped. Pure: TurnResult-like values in, dicts and floats out.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Iterable

from dualpath.bench import vllm_metrics
from dualpath.bench.tiers import sums as tier_sums
from shared.messages.codes import LoadMode


@dataclass(frozen=True, slots=True)
class Slo:
    ttft_s: float = 4.0
    tpot_s: float = 0.050
    target: float = 0.9  # attainment shown beside the verdict (the share of turns meeting both)
    warmup: float = 0.2  # share of a level's first turns (by start) left out of its verdict


def steady(turns, warmup: float) -> list:
    """The turns after the warm-up: all but the first `warmup` share by start time."""
    ordered = sorted(turns, key=lambda t: t.start)
    return ordered[int(len(ordered) * warmup):]


def verdict(run, slo: Slo) -> tuple[bool, str, float, float]:
    """(holds, the term that failed or "", steady mean TTFT, steady mean TPOT) of one online run."""
    ok = [t for t in steady(run.turns, slo.warmup) if not t.error]
    ttft = _mean(t.ttft for t in ok)
    tpot = _mean(t.tpot for t in ok)
    if getattr(run, "stopped", ""):
        return False, "ttft (stopped: " + run.stopped + ")", ttft, tpot
    if any(t.error for t in run.turns):
        return False, "errors", ttft, tpot
    if not ttft <= slo.ttft_s:
        return False, "ttft", ttft, tpot
    if tpot == tpot and tpot > slo.tpot_s:
        return False, "tpot", ttft, tpot
    return True, "", ttft, tpot


def _mean(values) -> float:
    xs = [v for v in values if v == v and not math.isinf(v)]
    return sum(xs) / len(xs) if xs else float("nan")


def spread(values) -> dict:
    """Median, min and max of the finite values (None when none)."""
    xs = sorted(v for v in values if v is not None and v == v and not math.isinf(v))
    if not xs:
        return {"median": None, "min": None, "max": None, "n": 0}
    return {"median": percentile(xs, 50), "min": xs[0], "max": xs[-1], "n": len(xs)}


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


def summarise(run, slo: Slo, vllm: vllm_metrics.Spec = vllm_metrics.Spec()) -> dict:
    """The per-run numbers of the JSON report (seconds), with the same figures under vLLM's keys (ms)."""
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
        "tiers": tier_sums(ok),
        "error_samples": sorted({t.error for t in run.turns if t.error})[:3],
    }
    for name, key in (("ttft", "ttft"), ("ttst", "ttst"), ("tpot", "tpot")):
        vals = [getattr(t, key) for t in ok]
        for q in (50, 90, 99):
            out[f"{name}_p{q}_s"] = percentile(vals, q)
    out["slo_attainment"] = (sum(meets(t, slo) for t in run.turns) / len(run.turns)) if run.turns else 0.0
    out["slo"] = {"ttft_s": slo.ttft_s, "tpot_s": slo.tpot_s, "target": slo.target, "warmup": slo.warmup}
    if run.kind == "online":
        holds, failed, ttft, tpot = verdict(run, slo)
        out.update(slo_holds=holds, slo_failed=failed, ttft_steady_mean_s=ttft, tpot_steady_mean_s=tpot)
    out.update(vllm_metrics.figures(run.turns, run.wall_s, vllm))
    return out


class ApsSearch:
    """The highest APS that holds the SLO: grow by `factor` until a level fails, then bisect."""

    def __init__(self, start: float, factor: float = 2.0, precision: float = 0.1, max_levels: int = 12):
        self.good, self.bad, self.aps, self.factor = 0.0, math.inf, start, factor
        self.precision, self.max_levels = precision, max_levels
        self.history: list[tuple[float, bool]] = []

    @property
    def done(self) -> bool:
        if len(self.history) >= self.max_levels:
            return True
        return self.good > 0 and self.bad < math.inf and self.bad <= self.good * (1 + self.precision)

    def next(self) -> float | None:
        return None if self.done else self.aps

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


BOUND_TERMS = ("storage_read_s", "storage_write_s", "prefill_s", "decode_s", "engines_cores_s", "cpu_s",
               "data_plane_s", "serial_s")


def run_name(r: dict) -> str:
    """The run's mode, and its agent-hint policy when it has one other than off."""
    return r["mode"] + (f" (hints {r['hints']})" if r.get("hints", "off") != "off" else "")


def summary(rows: list[dict]) -> dict:
    """Offline medians over repeats with their spread, per mode and between modes (speed-up over basic,
    JCT over oracle), pairing runs of one repeat; a run with hints other than off is its own line."""
    off = [r for r in rows if r["kind"] == "offline"]
    by: dict[str, list[dict]] = {}
    for r in off:
        by.setdefault(run_name(r), []).append(r)
    per_mode = {}
    for m, rs in by.items():
        limits = [(r.get("bound") or {}).get("limit") for r in rs]
        per_mode[m] = {
            "jct_s": spread(r["jct_s"] for r in rs), "bound_s": spread(r.get("jct_lower_bound_s") for r in rs),
            "jct_over_bound": spread(r.get("jct_over_bound") for r in rs),
            "predicted_jct_s": spread(r.get("predicted_jct_s") for r in rs),
            "measured_over_predicted": spread(r.get("measured_over_predicted") for r in rs),
            "measured_over_probe_only": spread(r.get("measured_over_probe_only") for r in rs),
            "measured_over_no_sharing": spread(r["jct_s"] / r["predicted_no_sharing_jct_s"] for r in rs
                                               if r.get("predicted_no_sharing_jct_s")),
            "hit_ratio": spread(r["hit_ratio"] for r in rs),
            "read_max_over_avg": spread(_max_over_avg(r.get("storage_read_bytes_per_node") or {}) for r in rs),
            "limit": max(set(limits), key=limits.count) if limits else None,
            "terms": {k: spread((r.get("bound") or {}).get(k) for r in rs) for k in BOUND_TERMS}}
    pairs = {}
    basic, oracle = LoadMode.BASIC.value, LoadMode.ORACLE.value
    for m in (LoadMode.DUALPATH.value, LoadMode.DUALPATH_SPLIT.value):
        if m in by and basic in by:
            speed, bounds = _paired(by, basic, m, "jct_s"), _paired(by, basic, m, "jct_lower_bound_s")
            pairs[f"{m}/{basic}"] = {"speedup": spread(speed), "bound_ratio": spread(bounds),
                                     "of_bound_ratio": spread(s / b for s, b in zip(speed, bounds) if s and b)}
        if m in by and oracle in by:
            pairs[f"{m}/{oracle}"] = {"jct_ratio": spread(_paired(by, m, oracle, "jct_s"))}
    hits = [v["hit_ratio"]["median"] for m, v in per_mode.items() if v["hit_ratio"]["median"] is not None
            and m in {x.value for x in LoadMode}]
    return {"offline": per_mode, "pairs": pairs, "hit_ratio_spread": (max(hits) - min(hits)) if hits else None}


def _paired(by: dict, num: str, den: str, key: str) -> list[float]:
    """num's `key` over den's, run by run of the same repeat."""
    out = []
    for r in by[num]:
        other = next((o for o in by[den] if o.get("repeat") == r.get("repeat")), None)
        if other and r.get(key) and other.get(key):
            out.append(r[key] / other[key])
    return out


def _max_over_avg(per_node: dict) -> float | None:
    vals = list(per_node.values())
    return max(vals) / (sum(vals) / len(vals)) if vals and sum(vals) > 0 else None
