"""A stored bench report's predictions again, from its stored rates and turns (no mesh needed).

Co-run slowdowns: the probe's (dualpath/bench/corun.py; 1.0 before it), raised to those under which
the simulated oracle run's engines compute the seconds its real ones measured (the one mode with no
KV path beside the engines), where those are more than the probe's.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from dualpath.sim.calibrate import MeshRates, simulate
from shared.messages.codes import LoadMode

ROUNDS = 12  # secant steps of the oracle fit
TOL = 0.002  # relative: the fit's busy seconds this close to the measured ones


def _offline(doc: dict, mode: str) -> list[dict]:
    return [r for r in doc["runs"] if r["kind"] == "offline" and r["mode"] == mode]


def oracle_busy(doc: dict) -> tuple[float, float] | None:
    """Median (prefill, decode) compute seconds of the oracle runs, summed over engines; None without."""
    rows = [r for r in _offline(doc, LoadMode.ORACLE) if (r.get("usage") or {}).get("prefill_s")]
    if not rows:
        return None
    pe = statistics.median(sum(r["usage"]["prefill_s"].values()) for r in rows)
    de = statistics.median(sum(r["usage"]["decode_s"].values()) for r in rows)
    return pe, de


def busy_s(r: MeshRates, turns: list, mode: str) -> tuple[float, float]:
    """The simulated (prefill, decode) compute seconds of a run, summed over engines."""
    res = simulate(r, turns, mode)
    return res.pe_busy * res.jct_s * r.prefill_nodes, res.de_busy * res.jct_s * r.decode_nodes


def _secant(k0: float, b0: float, k1: float, b1: float, want: float, lo: float = 1.0) -> float:
    if abs(b1 - b0) < 1e-12:
        return k1
    return max(lo, k1 + (want - b1) * (k1 - k0) / (b1 - b0))


def corun_from_oracle(r: MeshRates, turns: list, measured: tuple[float, float],
                      floor: tuple[float, float] = (1.0, 1.0)) -> MeshRates:
    """`r` with the co-run slowdowns (each >= its `floor`) that give the simulated oracle run the `measured`
    (prefill, decode) compute seconds; each found by secant steps, the other held at its last value."""
    lo_p, lo_d = floor
    prev = (lo_p, lo_d, *busy_s(replace(r, corun_prefill_slow=lo_p, corun_decode_slow=lo_d), turns, LoadMode.ORACLE))
    kp, kd = (max(lo, lo * m / b) if b > 0 else lo for lo, m, b in zip(floor, measured, prev[2:]))
    for _ in range(ROUNDS):
        pe, de = busy_s(replace(r, corun_prefill_slow=kp, corun_decode_slow=kd), turns, LoadMode.ORACLE)
        if abs(pe / measured[0] - 1) < TOL and abs(de / measured[1] - 1) < TOL:
            break
        nkp = _secant(prev[0], prev[2], kp, pe, measured[0], lo_p)
        nkd = _secant(prev[1], prev[3], kd, de, measured[1], lo_d)
        if (nkp, nkd) == (kp, kd):  # both at their floor (the runs computed faster) or converged
            break
        prev, kp, kd = (kp, kd, pe, de), nkp, nkd
    return replace(r, corun_prefill_slow=kp, corun_decode_slow=kd)


def oracle_corun(r: MeshRates, doc: dict, turns: list | None) -> MeshRates:
    """`r` on a shared host with co-run slowdowns no lower than its own and no lower than the report's
    oracle runs (`turns`, their engines' measured seconds) show; `r` itself without those runs."""
    busy = oracle_busy(doc)
    if not r.host_cores or busy is None or not turns:
        return r
    return corun_from_oracle(r, turns, busy, (r.corun_prefill_slow, r.corun_decode_slow))


def stored_rates(doc: dict) -> MeshRates | None:
    """The report's MeshRates: its probed co-run slowdowns, or its oracle runs' where those are higher."""
    pred = doc.get("prediction") or {}
    if not pred.get("rates"):
        return None
    probe = pred.get("probe") or {}
    r = replace(MeshRates(**pred["rates"]), corun_prefill_slow=probe.get("corun_prefill_slow", 1.0),
                corun_decode_slow=probe.get("corun_decode_slow", 1.0))  # the probe's: a report may hold raised ones
    return oracle_corun(r, doc, (pred.get("turns") or {}).get(LoadMode.ORACLE))


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
