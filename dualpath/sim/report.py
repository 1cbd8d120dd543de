"""Plain-text tables of simulation results."""
from __future__ import annotations

from dualpath.sim.metrics import SimResult
from shared.messages.codes import LoadMode


def format_runs(runs: list[SimResult], title: str = "") -> str:
    basic = next((r.jct_s for r in runs if r.mode == LoadMode.BASIC), None)
    head = (f"{'mode':14} {'JCT s':>8} {'vs basic':>8} {'TTFT p50':>9} {'p90':>7} {'TTST p50':>9} {'TPOT p50':>9} "
            f"{'SNIC max/avg':>12} {'attn max/avg':>12} {'events':>9} {'wall s':>7}")
    lines = [title, head] if title else [head]
    for r in runs:
        speed = f"{basic / r.jct_s:.2f}x" if basic and r.jct_s else "-"
        lines.append(f"{_label(r):14} {r.jct_s:8.0f} {speed:>8} {r.ttft_p50_s:9.2f} {r.ttft_p90_s:7.2f} {r.ttst_p50_s:9.2f} "
                     f"{r.tpot_p50_s * 1e3:7.1f}ms {r.snic_max_over_avg:12.2f} {r.attn_max_over_avg:12.3f} "
                     f"{r.events:9d} {r.wall_s:7.1f}")
    for r in runs:
        if r.stop_reason != "done":
            lines.append(f"  {_label(r)} online: stopped at {r.run_s:.0f} s ({r.stop_reason}), SLO "
                         f"{'met' if r.slo_ok else 'missed'}: window TTFT {r.ttft_window_s:.2f} s")
    for r in runs:
        util = " ".join(f"{k}={v['mean']:.2f}/{v['max']:.2f}" for k, v in r.link_util.items())
        lines.append(f"  {_label(r)} link util mean/max: {util}")
    for r in runs:
        lines.append(f"  {_label(r)} CNIC lanes: " + format_lanes(r))
    return "\n".join(lines)


def format_lanes(r: SimResult) -> str:
    """Model traffic per CNIC class and what sharing cost each lane."""
    parts = []
    for k, v in r.lanes.items():
        if v["model_gb"] or v["kv_gb"]:
            parts.append(f"{k} model {v['model_gb']:.0f} GB, KV {v['kv_gb']:.0f} GB slowed x{v['kv_slowdown']:.2f}, "
                         f"model slowed x{v['model_slowdown']:.4f}")
    return "; ".join(parts) or "no traffic"


def format_hints(runs: list[SimResult]) -> str:
    """TTFT of the turns after a tool call, per run and hint policy (runs without tool calls: empty)."""
    rows = [r for r in runs if r.after_tool]
    if not rows:
        return ""
    lines = [f"{'mode':14} {'hints':6} {'hinted p50':>10} {'p99':>7} {'unhinted p50':>12} {'p99':>7} "
             f"{'prefetched GB':>13} {'late':>5} {'JCT s':>8}"]
    for r in rows:
        a = r.after_tool
        lines.append(f"{str(r.mode):14} {r.hints:6} {a.get('hinted_ttft_p50_s', float('nan')):10.3f} "
                     f"{a.get('hinted_ttft_p99_s', float('nan')):7.3f} {a.get('unhinted_ttft_p50_s', float('nan')):12.3f} "
                     f"{a.get('unhinted_ttft_p99_s', float('nan')):7.3f} {r.prefetched_gb:13.1f} {r.prefetch_late:5d} "
                     f"{r.jct_s:8.0f}")
    return "\n".join(["turns after a tool call (TTFT s):"] + lines)


def _label(r: SimResult) -> str:
    return str(r.mode) + (f"/{r.hints}" if r.hints != "off" else "")
