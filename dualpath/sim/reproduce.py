"""`dualpath sim --reproduce`: the paper's published figures beside simulated ones, each gap explained.

Experiments: A offline JCT, B read and attention balance, C P/D sweep, D online capacity,
E scale, F the ablation. A row off by more than 15% carries its reason (reasons.py).
"""
from __future__ import annotations

import json
import time
from dataclasses import replace

from dualpath.sim import ablation, reasons
from dualpath.sim.config import SGLANG, SimConfig
from dualpath.sim.efficiency import DECODE_EFF, FIT_TARGET, PREFILL_EFF
from dualpath.sim.engine import run_sim
from dualpath.sim.hardware import HARDWARE
from dualpath.sim.metrics import SimResult
from dualpath.sim.window import format_report, sweep
from shared.benchrun import Conditions, start
from shared.messages.codes import LoadMode

BASIC, DUAL, ORACLE = LoadMode.BASIC, LoadMode.DUALPATH, LoadMode.ORACLE

_T0 = time.perf_counter()
FLAG = 0.15
ATTN_BALANCE = 1.05  # the balancing batcher's target in the reproduction (its rows in B)


_DONE: dict[SimConfig, SimResult] = {}  # a configuration two rows share runs once


def _run(cfg: SimConfig, log: list) -> SimResult:
    if cfg in _DONE:
        return _DONE[cfg]
    t = time.perf_counter()
    r = _DONE[cfg] = run_sim(cfg)
    log.append({"config": cfg.__dict__, "result": r.to_dict()})
    online = f" aps={cfg.aps:g}: {r.stop_reason} at {r.run_s:.0f} s, window TTFT {r.ttft_window_s:.2f} s" \
        if cfg.aps else f": JCT {r.jct_s:.0f} s"
    print(f"  run {len(log):2}: {cfg.model} {cfg.P}P{cfg.D}D {cfg.mode:8} assign={cfg.assign} agents={cfg.agents}"
          f"{online}, TTFT p50 {r.ttft_p50_s:.2f} s [{time.perf_counter() - t:.1f} s wall, "
          f"{time.perf_counter() - _T0:.0f} s so far]", flush=True)
    return r


def capacity(cfg: SimConfig, log: list, guess: float, iters: int) -> tuple[float, SimResult | None]:
    """Largest APS meeting the SLO by the stop rule: bracket from `guess`, then `iters` bisections."""
    ok, bad, best = 0.0, None, None
    aps = guess
    for _ in range(12):
        r = _run(replace(cfg, aps=aps), log)
        if r.slo_ok:
            ok, best = aps, r
            if bad is not None:
                break
            aps *= 2
        else:
            bad = aps
            if ok:
                break
            aps /= 2
    for _ in range(iters if ok and bad else 0):
        mid = (ok * bad) ** 0.5
        r = _run(replace(cfg, aps=mid), log)
        if r.slo_ok:
            ok, best = mid, r
        else:
            bad = mid
    return ok, best


def main(quick: bool = False, full: bool = False, json_path: str | None = None, online: bool = True,
         conditions: Conditions | None = None) -> int:
    global _T0
    conditions, _T0 = conditions or start("dualpath sim --reproduce"), time.perf_counter()
    _DONE.clear()
    size = "quick: a quarter of the lengths, a fifth of the agents" if quick else "full size"
    print(f"reproducing the published figures ({size}; one line per simulator run) ...", flush=True)
    print(f"engines at {PREFILL_EFF:g} (prefill) and {DECODE_EFF:g} (decode) of the kernels' published rates: "
          f"the one fitted input (dualpath sim --fit-efficiency); every other figure is predicted", flush=True)
    log: list = []
    rows: list[tuple] = []  # (experiment, metric, published text, simulated, published value, reason)
    scale = 0.25 if quick else 1.0
    n660 = 400 if quick else 2000
    base = SimConfig(model="ds-v3.2-660b", P=2, D=4, trace="gen:64k", agents=n660, scale=scale)

    print("A/B. offline JCT, DS-660B 2P4D, 64K trace")
    a = {m: _run(replace(base, mode=m), log) for m in (BASIC, DUAL, ORACLE, SGLANG)}
    rr = _run(replace(base, mode=DUAL, assign="rr"), log)
    sp = a[BASIC].jct_s / a[DUAL].jct_s
    rows.append(("A", "JCT speedup dualpath / basic", "up to 1.87x", sp, 1.87, reasons.speedup(a, base)))
    rows.append(("A", "JCT dualpath / oracle (the fitted figure)", f"close to 1 (<= {FIT_TARGET:g})",
                 a[DUAL].jct_s / a[ORACLE].jct_s, 1.0, reasons.oracle_gap(a, base)))
    rows.append(("A", "JCT sglang-style / dualpath", "(not given)", a[SGLANG].jct_s / a[DUAL].jct_s, None, ""))
    gains = {1.0: sp}
    for f in (0.5, 2.0):
        b = _run(replace(base, mode=BASIC, append_scale=f), log)
        d = _run(replace(base, mode=DUAL, append_scale=f), log)
        gains[f] = b.jct_s / d.jct_s
    lo_g, hi_g = min(gains.values()), max(gains.values())
    why = reasons.appends(gains, base)
    rows.append(("A", "min speedup over appends x0.5, x1, x2", "1.82x", lo_g, 1.82, why))
    rows.append(("A", "max speedup over appends x0.5, x1, x2", "1.99x", hi_g, 1.99, why))
    rows.append(("B", "SNIC max/avg, round-robin", "1.53", rr.snic_max_over_avg, 1.53, reasons.snic_rr(rr, base)))
    rows.append(("B", "SNIC max/avg, scheduler", "1.18", a[DUAL].snic_max_over_avg, 1.18,
                 reasons.snic_policy(a[DUAL], base)))
    plain = _attention_rows(a[DUAL], base, quick, log, rows)
    regime = [reasons.binding(f"2P4D dualpath, {'quick' if quick else 'full size'} ({base.agents} agents)", a[DUAL])]
    if quick:
        regime.append(reasons.binding("2P4D dualpath, full size (2000 agents)", plain))

    print("C. P/D sweep, DS-27B, 64K trace")
    c_base = replace(base, model="ds-27b", agents=150 if quick else 600)
    res = {(P, D, m): _run(replace(c_base, P=P, D=D, mode=m), log)
           for P, D in ((1, 1), (1, 3), (2, 2), (3, 1)) for m in (BASIC, DUAL)}
    four = [res[(p, d, DUAL)].jct_s for p, d in ((1, 3), (2, 2), (3, 1))]
    rows.append(("C", "P+D=4: max/min JCT over 1P3D,2P2D,3P1D", "~1 (alike)", max(four) / min(four), 1.0,
                 reasons.pd_alike(res, c_base, HARDWARE[c_base.hardware].gpus)))
    pd_gain = {(p, d): res[(p, d, BASIC)].jct_s / res[(p, d, DUAL)].jct_s
               for p, d in ((1, 1), (1, 3), (2, 2), (3, 1))}
    why = reasons.pd_sweep(res, c_base)
    rows.append(("C", "mean speedup over P/D ratios", "1.64x", sum(pd_gain.values()) / len(pd_gain), 1.64, why))
    rows.append(("C", "max speedup over P/D ratios", "2.46x", max(pd_gain.values()), 2.46, why))

    lag = 1800.0 * scale
    if online:
        _capacity_rows(base, lag, scale, quick, log, rows)
    else:
        rows.append(("D", "online capacity rows", "1.67x, 2.25x, 1.96x", None, None,
                     "not run (--no-online): the capacity search is the costliest part of the reproduction"))

    k = 24 if full else 4
    print(f"E. scale: 2P4D with {n660} agents vs {2 * k}P{4 * k}D with {n660 * k} agents")
    big = _run(replace(base, P=2 * k, D=4 * k, agents=n660 * k, mode=DUAL, progress=True), log)
    rows.append(("E", f"JCT {2 * k}P{4 * k}D / 2P4D (dualpath)", "~1 (nearly equal)",
                 big.jct_s / a[DUAL].jct_s, 1.0, ""))
    rows.append(("E", "online 44P88D / 2P4D throughput", "22x", None, 22.0, reasons.NOT_RUN_44P88D))

    _ablation_rows(quick, log, rows)

    print()
    print("\n".join(regime))
    print(format_table(rows, comparable=not quick))
    print()
    for name in HARDWARE:
        print(format_report(sweep(HARDWARE[name])))
    if json_path:
        write_json(json_path, rows, log, conditions, {"comparable": not quick, "regime": regime,
                                                      "prefill_eff": PREFILL_EFF, "decode_eff": DECODE_EFF})
    return 0


def _attention_rows(dual: SimResult, base: SimConfig, quick: bool, log: list, rows: list) -> SimResult:
    """B's attention rows (per step, quota-cut steps, per run, the balancing batcher); returns the
    full-size dualpath run they read the balancing batcher against."""
    rows.append(("B", "attention max/avg across GPUs", "< 1.06", dual.attn_max_over_avg, 1.06,
                 reasons.attention(dual)))
    cut = dual.attn_balance.get("cut_ratio", float("nan"))
    rows.append(("B", "  the same, steps the quota cut on every GPU", "< 1.06", cut if cut == cut else None, 1.06,
                 "no step in which the quota cut every GPU's batch (see the row above)"))
    rows.append(("B", "  the same, each GPU's attention summed over the run", "< 1.06",
                 dual.attn_balance.get("run_ratio"), 1.06,
                 f"{dual.requests} requests over the GPUs: Algorithm 1 evens the prompt tokens each GPU is given, "
                 f"not their attention time, which grows with each prompt's context"))
    # the balancing batcher (--attn-balance), read where it can be: full size (a quick run's GPUs hold
    # too little ready work for a 64-token chunk to be a small step)
    plain = dual if not quick else _run(replace(base, mode=DUAL, agents=2000, scale=1.0), log)
    bal = _run(replace(base, mode=DUAL, agents=2000, scale=1.0, attn_balance=ATTN_BALANCE), log)
    rows.append(("B", f"  the same, batches cut to balance (--attn-balance {ATTN_BALANCE:g})", "< 1.06",
                 bal.attn_max_over_avg, 1.06, reasons.attention_balanced(bal, plain)))
    rows.append(("B", "  its JCT over the paper's batcher (2000 agents)", "(not given)",
                 bal.jct_s / plain.jct_s, None, ""))
    return plain


def _ablation_rows(quick: bool, log: list, rows: list) -> None:
    """F: each technique's JCT change, with the reason from Basic's run (its HBM cap)."""
    print("F. ablation, DS-660B 2P4D, 64K trace")
    table = ablation.main(quick, run=lambda cfg: _run(cfg, log))
    basic_cfg = ablation.configs(ablation.base_config(quick))[0][1]
    basic = _run(basic_cfg, log)  # run above, kept in _DONE
    for name, _, change, pub in table[1:]:
        row = ("F", f"ablation {name}: JCT change", f"{pub:+.2f}%", change, pub, "")
        rows.append(reasons.ablation_reason(row, table, basic, basic_cfg))


def write_json(path: str, rows: list, log: list, conditions: Conditions, about: dict | None = None) -> None:
    """{"rows": [[experiment, metric, published text, simulated, published, reason]], "runs", "conditions",
    and `about`'s keys: comparable (False for --quick), regime (binding resources), the efficiencies}."""
    doc = {"rows": rows, "runs": log, "conditions": conditions.measure().report(), **(about or {})}
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=1, default=str)


def _capacity_rows(base: SimConfig, lag: float, scale: float, quick: bool, log: list, rows: list) -> None:
    """D: capacity at the SLO by the stop rule, dualpath over basic, for both models."""
    print(f"D. online capacity at the SLO (stop rule: TTFT > 4 s or TPOT > 50 ms fails; steady = a 150 s window's "
          f"TTFT within 5% of the window {lag:.0f} s before; at most {2 * lag + 150:.0f} s)")
    iters = 2 if quick else 4
    caps = {}
    for name, model, P, D, guess, pub in (("DS-27B 1P1D", "ds-27b", 1, 1, 0.7, 1.67),
                                          ("DS-660B 2P4D", "ds-v3.2-660b", 2, 4, 0.5, 2.25)):
        on = replace(base, model=model, P=P, D=D, agents=100_000, steady_lag_s=lag)
        got = {m: capacity(replace(on, mode=m), log, guess / scale, iters) for m in (BASIC, DUAL)}
        caps[name] = got
        ratio = got[DUAL][0] / got[BASIC][0] if got[BASIC][0] else None
        rows.append(("D", f"APS at SLO {name}: {got[DUAL][0]:.2f} vs {got[BASIC][0]:.2f}", f"{pub}x",
                     ratio, pub, reasons.capacity(got, pub, model)))
    ratios = [v[DUAL][0] / v[BASIC][0] for v in caps.values() if v[BASIC][0]]
    rows.append(("D", "mean capacity gain (two models here, three published)", "1.96x",
                 sum(ratios) / len(ratios) if ratios else None, 1.96, ""))
    tp = [(v[DUAL][1].tpot_p50_s / v[BASIC][1].tpot_p50_s) for v in caps.values()
          if v[DUAL][1] and v[BASIC][1]]
    rows.append(("D", "TPOT p50 at capacity, dualpath / basic", "~1 (no penalty)", max(tp) if tp else None, 1.0, ""))


def gap(sim: float | None, pub: float | None) -> float | None:
    """Relative gap; for percentage rows (negative published values) the gap of the changes."""
    if sim is None or not pub:
        return None
    return sim / pub - 1


QUICK = ("quick rows are not comparable with the published figures: a fifth of the agents and a quarter of "
         "the lengths on the paper's bandwidths move the run into another regime (the binding resources above)")


def format_table(rows: list, comparable: bool = True) -> str:
    out = [f"{'':2} {'metric':52} {'published':>16} {'simulated':>10} {'gap':>7}"]
    if not comparable:
        out.insert(0, QUICK)
    notes = []
    for exp, metric, pub_text, sim, pub, why in rows:
        sim_s = "-" if sim is None else f"{sim:.2f}"
        g = gap(sim, pub)
        gap_s = "" if g is None else f"{g * 100:+.0f}%"
        flag = " *" if g is None and sim is None or (g is not None and abs(g) > FLAG) else ""
        if not comparable:
            flag, gap_s = "", "n/c" if g is not None else ""
        out.append(f"{exp:2} {metric:52} {pub_text:>16} {sim_s:>10} {gap_s:>7}{flag}")
        if flag and why:
            notes.append(f"  * {exp} {metric}: {why}")
    if comparable:
        out.append(f"* gap > {FLAG:.0%} (or not simulated); the reasons, from the runs' own figures:")
    return "\n".join(out + notes)
