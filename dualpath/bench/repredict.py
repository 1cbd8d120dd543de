"""A bench report's predictions, made or made again from its stored rates and turns (no mesh needed).

Co-run slowdowns: the probe's (dualpath/bench/corun.py; 1.0 before it), raised for the rows of repeat k
to those under which the simulated oracle run's engines compute the seconds the real ones of the OTHER
repeats measured (the one mode with no KV path beside the engines): each repeat predicted out of sample.
"""
from __future__ import annotations

import statistics
from dataclasses import replace

from dualpath.sim.calibrate import MeshRates, simulate
from shared.messages.codes import LoadMode

ROUNDS = 12  # secant steps of the oracle fit
TOL = 0.002  # relative: the fit's busy seconds this close to the measured ones
ROW_KEYS = ("predicted_jct_s", "measured_over_predicted", "predicted_no_sharing_jct_s", "predicted_probe_only_jct_s",
            "measured_over_probe_only")


def _offline(doc: dict, mode: str) -> list[dict]:
    return [r for r in doc["runs"] if r["kind"] == "offline" and r["mode"] == mode]


def repeat_of(row: dict) -> int:
    """The row's repeat (0 for a row that names none)."""
    return row.get("repeat") or 0


def oracle_busy(doc: dict, exclude_repeat: int | None = None) -> tuple[float, float] | None:
    """Median (prefill, decode) compute seconds of the oracle runs, summed over engines, leaving out
    those of `exclude_repeat`; None without any."""
    rows = [r for r in _offline(doc, LoadMode.ORACLE) if (r.get("usage") or {}).get("prefill_s")
            and repeat_of(r) != exclude_repeat]
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


def oracle_corun(r: MeshRates, doc: dict, turns: list | None, exclude_repeat: int | None = None) -> MeshRates:
    """`r` on a shared host with co-run slowdowns no lower than its own and no lower than the report's
    oracle runs (`turns`; their engines' measured seconds, `exclude_repeat`'s left out) show; `r` itself
    without such runs."""
    busy = oracle_busy(doc, exclude_repeat)
    if not r.host_cores or busy is None or not turns:
        return r
    return corun_from_oracle(r, turns, busy, (r.corun_prefill_slow, r.corun_decode_slow))


def loo_rates(r: MeshRates, doc: dict, turns: list | None) -> dict[int, MeshRates]:
    """Per repeat of the offline rows: `r` raised to what the oracle runs of the other repeats measured
    (one fit a repeat; with one repeat, `r` itself)."""
    repeats = sorted({repeat_of(x) for x in doc["runs"] if x["kind"] == "offline"})
    return {k: oracle_corun(r, doc, turns, k) for k in repeats}


def base_rates(doc: dict) -> MeshRates | None:
    """The report's MeshRates at the probe's co-run slowdowns (an older report stored them raised)."""
    pred = doc.get("prediction") or {}
    if not pred.get("rates"):
        return None
    probe = pred.get("probe") or {}
    return replace(MeshRates(**pred["rates"]), corun_prefill_slow=probe.get("corun_prefill_slow", 1.0),
                   corun_decode_slow=probe.get("corun_decode_slow", 1.0))


def stored_rates(doc: dict, repeat: int | None = None) -> MeshRates | None:
    """The MeshRates that predict `repeat`'s rows: the probe's co-run slowdowns, raised to what the oracle
    runs of the other repeats measured; `repeat` None: to what all of them measured (in sample)."""
    r = base_rates(doc)
    if r is None:
        return None
    turns = ((doc.get("prediction") or {}).get("turns") or {}).get(LoadMode.ORACLE)
    return oracle_corun(r, doc, turns, repeat)


def _jct(memo: dict, r: MeshRates, turns: list, mode: str, shared: bool = True) -> float:
    key = (r, mode, shared)
    if key not in memo:
        memo[key] = simulate(r, turns, mode, shared_cores=shared).jct_s
    return memo[key]


def _over(measured: float, predicted: float | None) -> float | None:
    return measured / predicted if predicted else None


def predict_rows(doc: dict, base: MeshRates | None, lengths: dict) -> None:
    """Each offline row's predicted JCT at its repeat's leave-one-out rates (`loo_rates`) and at `base`'s
    (the probe's) slowdowns alone; None where it cannot be predicted. The slowdowns each repeat took go to
    doc["prediction"]["corun_by_repeat"] ({repeat: [prefill, decode]})."""
    offline = [r for r in doc["runs"] if r["kind"] == "offline"]
    for row in offline:
        for key in ROW_KEYS:
            row[key] = None
    if base is None:
        return
    by_repeat = loo_rates(base, doc, lengths.get(LoadMode.ORACLE))
    doc.setdefault("prediction", {})["corun_by_repeat"] = {
        str(k): [r.corun_prefill_slow, r.corun_decode_slow] for k, r in by_repeat.items()}
    memo: dict = {}
    for row in offline:
        mode, turns = row["mode"], lengths.get(row["mode"])
        if not turns:
            continue
        r = by_repeat[repeat_of(row)]
        row["predicted_jct_s"] = got = _jct(memo, r, turns, mode)
        row["measured_over_predicted"] = _over(row["jct_s"], got)
        row["predicted_probe_only_jct_s"] = alone = _jct(memo, base, turns, mode)
        row["measured_over_probe_only"] = _over(row["jct_s"], alone)
        if r.kv_cpu_s_per_byte or r.host_cores:  # what the simulator predicts when the KV path has cores of its own
            row["predicted_no_sharing_jct_s"] = _jct(memo, r, turns, mode, shared=False)


def repredict(doc: dict) -> dict[str, dict[str, float]]:
    """Per mode, from the report's stored rates and turns, as the bench predicts: the median measured JCT,
    the medians of the rows' predicted JCT and measured / predicted (leave-one-out), and the median
    measured / predicted at the probe's slowdowns alone. The document is left as it is."""
    runs = [dict(r) for r in doc["runs"] if r["kind"] == "offline"]
    turns = (doc.get("prediction") or {}).get("turns") or {}
    copy = {"runs": runs, "prediction": dict(doc.get("prediction") or {})}
    predict_rows(copy, base_rates(doc), turns)
    out: dict[str, dict[str, float]] = {}
    for mode in turns:
        rows = [r for r in runs if r["mode"] == mode and r["predicted_jct_s"]]
        if rows:
            out[mode] = {k: statistics.median(r[k] for r in rows) for k in (
                "jct_s", "predicted_jct_s", "measured_over_predicted", "measured_over_probe_only")}
    return out


def restamp(doc: dict) -> dict:
    """The report's prediction fields (rows, rates, summary) rewritten under the rule above from its stored
    rates, probe, turns and oracle rows' engine seconds; in place, returned."""
    from dualpath.bench.metrics import summary

    base = base_rates(doc)
    if base is not None:
        doc["prediction"]["rates"] = vars(base)
    predict_rows(doc, base, (doc.get("prediction") or {}).get("turns") or {})
    if "summary" in doc:
        doc["summary"] = summary(doc["runs"])
    return doc
