"""The P/D-ratio window, numerically, from the simulator's traffic table.

Each link's demand over its capacity; the ratio where it crosses 1 is bisected and set beside the closed form.
"""
from __future__ import annotations

from dataclasses import dataclass

from dualpath.sim.hardware import Hardware
from dualpath.sim.traffic import link_bytes
from shared.sched.policy import ReadPath

LINKS = (("pe", "cnic_r"), ("pe", "cnic_w"), ("de", "cnic_r"), ("de", "cnic_w"), ("de", "dram"))


def utilisation(hw: Hardware, ratio: float) -> dict[str, float]:
    """Utilisation of each link class at P/D = ratio (line-rate units, link_eff ignored)."""
    g, B, s, M = hw.gpus, 1.0, hw.s, hw.dram_bw / (hw.cnic_gbps * 1e9 / 8)
    P, D = ratio, 1.0
    pe_path = P * B * s  # bytes/s read by all PE nodes (PE path)
    de_path = D * B * s  # bytes/s read by all DE nodes (DE path)
    tp, tc = link_bytes(ReadPath.PE, 1.0, 0.0), link_bytes(ReadPath.DE, 1.0, 0.0)
    out = {}
    for side, link in LINKS:
        engines = (P if side == "pe" else D) * g
        demand = (tp.get((side, link), 0.0) * pe_path + tc.get((side, link), 0.0) * de_path) / engines
        cap = B
        if link == "dram":
            demand *= g  # a node's DRAM serves all its engines
            cap = M
        out[f"{side}.{link}"] = demand / cap
    return out


def closed_form(hw: Hardware) -> dict[str, float]:
    """The closed-form bounds on P/D (lower bound from PE CNIC write)."""
    g, s = hw.gpus, hw.s
    m = hw.dram_bw / (hw.cnic_gbps * 1e9 / 8) / s
    return {"pe.cnic_w": s / (g - s), "de.cnic_r": (g - 2 * s) / s,
            "de.cnic_w": (g - s) / (2 * s), "de.dram": (m - 3) / 2}


def crossing(hw: Hardware, link: str) -> float | None:
    """P/D where `link` reaches utilisation 1 (None if it never does in [1/64, 64])."""
    lo, hi = 1 / 64, 64.0
    f = lambda x: utilisation(hw, x)[link] - 1.0  # noqa: E731
    if f(lo) * f(hi) > 0:
        return None
    for _ in range(60):
        mid = (lo * hi) ** 0.5
        if f(lo) * f(mid) <= 0:
            hi = mid
        else:
            lo = mid
    return (lo * hi) ** 0.5


@dataclass
class WindowReport:
    hw: str
    lower: float
    upper: float
    rows: list[tuple[float, dict[str, float], str]]
    checks: list[tuple[str, float, float | None]]  # (link, closed form, numeric crossing)


def sweep(hw: Hardware, ratios: list[float] | None = None) -> WindowReport:
    cf = closed_form(hw)
    lower = cf["pe.cnic_w"]
    upper = min(cf["de.cnic_r"], cf["de.cnic_w"], cf["de.dram"])
    ratios = ratios or [1 / 16, 1 / 8, 1 / 4, 1 / 3, 1 / 2, 1, 1.5, 2, 3, 3.5, 4, 6, 8]
    rows = []
    for x in ratios:
        u = utilisation(hw, x)
        worst = max(u, key=u.get)
        rows.append((x, u, worst if u[worst] > 1.0 + 1e-9 else "-"))
    checks = [(k, v, crossing(hw, k)) for k, v in cf.items()]
    checks.append(("pe.cnic_r", float("nan"), crossing(hw, "pe.cnic_r")))
    return WindowReport(hw.name, lower, upper, rows, checks)


def format_report(rep: WindowReport) -> str:
    cols = list(rep.rows[0][1])
    lines = [f"P/D window on {rep.hw}: {rep.lower:.3f} <= P/D <= {rep.upper:.3f}",
             "  P/D    " + " ".join(f"{c:>10}" for c in cols) + "  saturated"]
    for x, u, worst in rep.rows:
        mark = "" if rep.lower - 1e-9 <= x <= rep.upper + 1e-9 else "  (outside)"
        lines.append(f"  {x:6.3f} " + " ".join(f"{u[c]:10.2f}" for c in cols) + f"  {worst}{mark}")
    lines.append("  bound        closed form   numeric crossing (utilisation = 1)")
    for link, cf, num in rep.checks:
        cf_s = "-" if cf != cf else f"{cf:.4f}"
        num_s = "never" if num is None else f"{num:.4f}"
        lines.append(f"  {link:12} {cf_s:>11}   {num_s:>11}")
    return "\n".join(lines)
