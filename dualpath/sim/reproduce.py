"""`dualpath sim --reproduce`: the paper's published figures beside simulated ones.

The published figures and what the simulator leaves out are in docs/design.md
("Published figures"); rows whose gap exceeds 15% are flagged and explained there.

Experiments (each a few simulator runs; `quick` shrinks them, `full` adds 48P96D):
  A offline JCT, DS-660B 2P4D, 64K trace: basic / dualpath / oracle
  B SNIC read traffic max/avg: round-robin scheduling vs the policy (same setting as A)
  C P/D sweep, DS-27B: equal total storage bandwidth (P+D fixed) => similar JCT
  D online capacity at SLO (TTFT <= 4 s, TPOT <= 50 ms): DS-27B 1P1D, DS-660B 2P4D
  E scale: 2P4D with 2K agents vs a 24x larger cluster with 24x the agents
Then the P/D window sweep (window.py). Prints one line per simulator run as it ends
(with its wall time), then the table; writes JSON with --json. `--quick` takes about
7 minutes on 2 cores; the default size is some twenty times the simulated work.
"""
from __future__ import annotations

import json
import time
from dataclasses import replace

from dualpath.sim.config import SimConfig
from dualpath.sim.engine import run_sim
from dualpath.sim.hardware import HARDWARE
from dualpath.sim.metrics import SimResult
from dualpath.sim.window import format_report, sweep
from shared.messages.codes import LoadMode

BASIC, DUAL, ORACLE = LoadMode.BASIC, LoadMode.DUALPATH, LoadMode.ORACLE


_T0 = time.perf_counter()


def _run(cfg: SimConfig, log: list) -> SimResult:
    t = time.perf_counter()
    r = run_sim(cfg)
    log.append({"config": cfg.__dict__, "result": r.to_dict()})
    print(f"  run {len(log):2}: {cfg.model} {cfg.P}P{cfg.D}D {cfg.mode:8} assign={cfg.assign} agents={cfg.agents} "
          f"aps={cfg.aps:g}: JCT {r.jct_s:.0f} s, TTFT p50 {r.ttft_p50_s:.2f} s "
          f"[{time.perf_counter() - t:.1f} s wall, {time.perf_counter() - _T0:.0f} s so far]", flush=True)
    return r


def capacity(cfg: SimConfig, log: list, lo: float, hi: float, iters: int) -> float:
    """Largest APS meeting the SLO, by doubling then bisection over online runs."""
    while _run(replace(cfg, aps=hi), log).slo_ok:
        lo, hi = hi, hi * 2
    for _ in range(iters):
        mid = (lo + hi) / 2
        if _run(replace(cfg, aps=mid), log).slo_ok:
            lo = mid
        else:
            hi = mid
    return lo


def main(quick: bool = False, full: bool = False, json_path: str | None = None) -> int:
    global _T0
    _T0 = time.perf_counter()
    size = "--quick: about 5 minutes on 2 cores" if quick else "full size: some 20x the work of --quick"
    print(f"reproducing the published figures ({size}; one line per simulator run) ...", flush=True)
    log: list = []
    rows: list[tuple[str, str, str, float | None, float | None]] = []
    scale = 0.25 if quick else 1.0
    n660 = 400 if quick else 2000
    base = SimConfig(model="ds-v3.2-660b", P=2, D=4, trace="gen:64k", agents=n660, scale=scale)

    print("A/B. offline JCT, DS-660B 2P4D, 64K trace")
    a = {m: _run(replace(base, mode=m), log) for m in (BASIC, DUAL, ORACLE)}
    rr = _run(replace(base, mode=DUAL, assign="rr"), log)
    rows.append(("A", "JCT speedup dualpath / basic", "up to 1.87x",
                 a[BASIC].jct_s / a[DUAL].jct_s, 1.87))
    rows.append(("A", "JCT dualpath / oracle", "close to 1", a[DUAL].jct_s / a[ORACLE].jct_s, 1.0))
    rows.append(("B", "SNIC max/avg, round-robin", "1.53", rr.snic_max_over_avg, 1.53))
    rows.append(("B", "SNIC max/avg, scheduler", "1.18", a[DUAL].snic_max_over_avg, 1.18))
    rows.append(("B", "attention max/avg across GPUs", "< 1.06", a[DUAL].attn_max_over_avg, 1.06))

    print("C. P/D sweep, DS-27B, 64K trace")
    c_base = replace(base, model="ds-27b", agents=150 if quick else 600)
    jct = {}
    for P, D in ((1, 1), (1, 3), (2, 2), (3, 1)):
        for m in (BASIC, DUAL):
            jct[(P, D, m)] = _run(replace(c_base, P=P, D=D, mode=m), log).jct_s
    four = [jct[(p, d, DUAL)] for p, d in ((1, 3), (2, 2), (3, 1))]
    rows.append(("C", "P+D=4: max/min JCT over 1P3D,2P2D,3P1D", "~1 (alike)", max(four) / min(four), 1.0))
    gains = [jct[(p, d, BASIC)] / jct[(p, d, DUAL)] for p, d in ((1, 1), (1, 3), (2, 2), (3, 1))]
    rows.append(("C", "mean speedup over P/D ratios", "1.64x", sum(gains) / len(gains), 1.64))
    rows.append(("C", "max speedup over P/D ratios", "2.46x", max(gains), 2.46))

    print("D. online capacity at SLO")
    iters = 3 if quick else 5
    dur = 300.0 if quick else 600.0
    for name, model, P, D, guess, pub in (("DS-27B 1P1D", "ds-27b", 1, 1, 0.5, 1.67),
                                          ("DS-660B 2P4D", "ds-v3.2-660b", 2, 4, 0.25, 2.25)):
        on = replace(base, model=model, P=P, D=D, agents=100_000, duration_s=dur)
        caps = {m: capacity(replace(on, mode=m), log, 0.0, guess, iters) for m in (BASIC, DUAL)}
        rows.append(("D", f"APS at SLO {name}: {caps[DUAL]:.2f} vs {caps[BASIC]:.2f}", f"{pub}x",
                     caps[DUAL] / caps[BASIC] if caps[BASIC] else None, pub))

    k = 24 if full else 4
    print(f"E. scale: 2P4D with {n660} agents vs {2 * k}P{4 * k}D with {n660 * k} agents")
    big = _run(replace(base, P=2 * k, D=4 * k, agents=n660 * k, mode=DUAL, progress=True), log)
    rows.append(("E", f"JCT {2 * k}P{4 * k}D / 2P4D (dualpath)", "~1 (nearly equal)",
                 big.jct_s / a[DUAL].jct_s, 1.0))

    print()
    print(format_table(rows))
    print()
    for name in HARDWARE:
        print(format_report(sweep(HARDWARE[name])))
    if json_path:
        with open(json_path, "w", encoding="utf-8") as fh:
            json.dump({"rows": rows, "runs": log}, fh, indent=1, default=str)
    return 0


def format_table(rows: list) -> str:
    out = [f"{'':2} {'metric':48} {'published':>18} {'simulated':>10} {'gap':>7}"]
    for exp, metric, pub_text, sim, pub in rows:
        sim_s = "-" if sim is None else f"{sim:.2f}"
        gap = "" if sim is None or not pub else f"{(sim / pub - 1) * 100:+.0f}%"
        flag = " *" if gap and abs(sim / pub - 1) > 0.15 else ""
        out.append(f"{exp:2} {metric:48} {pub_text:>18} {sim_s:>10} {gap:>7}{flag}")
    out.append("* gap > 15%: docs/design.md#published-figures says what the simulator leaves out")
    return "\n".join(out)
