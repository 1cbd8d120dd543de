"""A stored bench report's predictions again, from its stored rates and turns (no mesh needed).

A report from before the co-run probe (dualpath/bench/corun.py) holds no co-run slowdowns; they
are then taken from its oracle runs: the slowdowns under which the simulated oracle run's engines
compute the seconds the real ones measured (the one mode with no KV path beside the engines).
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from dualpath.sim.calibrate import MeshRates, simulate

ROUNDS = 12  # secant steps of the oracle fit
TOL = 0.002  # relative: the fit's busy seconds this close to the measured ones


def _offline(doc: dict, mode: str) -> list[dict]:
    return [r for r in doc["runs"] if r["kind"] == "offline" and r["mode"] == mode]


def oracle_busy(doc: dict) -> tuple[float, float] | None:
    """Median (prefill, decode) compute seconds of the oracle runs, summed over engines; None without."""
    rows = [r for r in _offline(doc, "oracle") if (r.get("usage") or {}).get("prefill_s")]
    if not rows:
        return None
    pe = statistics.median(sum(r["usage"]["prefill_s"].values()) for r in rows)
    de = statistics.median(sum(r["usage"]["decode_s"].values()) for r in rows)
    return pe, de


def busy_s(r: MeshRates, turns: list, mode: str) -> tuple[float, float]:
    """The simulated (prefill, decode) compute seconds of a run, summed over engines."""
    res = simulate(r, turns, mode)
    return res.pe_busy * res.jct_s * r.prefill_nodes, res.de_busy * res.jct_s * r.decode_nodes


def _secant(k0: float, b0: float, k1: float, b1: float, want: float) -> float:
    if abs(b1 - b0) < 1e-12:
        return k1
    return max(1.0, k1 + (want - b1) * (k1 - k0) / (b1 - b0))


def corun_from_oracle(r: MeshRates, turns: list, measured: tuple[float, float]) -> MeshRates:
    """`r` with the co-run slowdowns (>= 1) that give the simulated oracle run the `measured`
    (prefill, decode) compute seconds; each found by secant steps, the other held at its last value."""
    prev = (1.0, 1.0, *busy_s(replace(r, corun_prefill_slow=1.0, corun_decode_slow=1.0), turns, "oracle"))
    kp, kd = (max(1.0, m / b) for m, b in zip(measured, prev[2:]))
    for _ in range(ROUNDS):
        pe, de = busy_s(replace(r, corun_prefill_slow=kp, corun_decode_slow=kd), turns, "oracle")
        if abs(pe / measured[0] - 1) < TOL and abs(de / measured[1] - 1) < TOL:
            break
        nkp, nkd = _secant(prev[0], prev[2], kp, pe, measured[0]), _secant(prev[1], prev[3], kd, de, measured[1])
        prev, kp, kd = (kp, kd, pe, de), nkp, nkd
    return replace(r, corun_prefill_slow=kp, corun_decode_slow=kd)


def stored_rates(doc: dict) -> MeshRates | None:
    """The report's MeshRates; without probed co-run slowdowns on a shared host, its oracle runs' instead."""
    pred = doc.get("prediction") or {}
    if not pred.get("rates"):
        return None
    r = MeshRates(**pred["rates"])
    probed = "corun_decode_slow" in (pred.get("probe") or {})
    busy, turns = oracle_busy(doc), (pred.get("turns") or {}).get("oracle")
    if probed or not r.host_cores or busy is None or not turns:
        return r
    return corun_from_oracle(r, turns, busy)


def repredict(doc: dict) -> dict[str, dict[str, float]]:
    """Per mode: the median measured JCT, the predicted one and measured / predicted."""
    r = stored_rates(doc)
    out: dict[str, dict[str, float]] = {}
    for mode, turns in ((doc.get("prediction") or {}).get("turns") or {}).items():
        rows = _offline(doc, mode)
        if r is None or not rows or not turns:
            continue
        measured = statistics.median(x["jct_s"] for x in rows)
        got = simulate(r, turns, mode).jct_s
        out[mode] = {"jct_s": measured, "predicted_jct_s": got, "measured_over_predicted": measured / got}
    return out
