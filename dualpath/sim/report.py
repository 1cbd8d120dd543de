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
        lines.append(f"{r.mode:14} {r.jct_s:8.0f} {speed:>8} {r.ttft_p50_s:9.2f} {r.ttft_p90_s:7.2f} {r.ttst_p50_s:9.2f} "
                     f"{r.tpot_p50_s * 1e3:7.1f}ms {r.snic_max_over_avg:12.2f} {r.attn_max_over_avg:12.3f} "
                     f"{r.events:9d} {r.wall_s:7.1f}")
    for r in runs:
        if r.stop_reason != "done":
            lines.append(f"  {r.mode} online: stopped at {r.run_s:.0f} s ({r.stop_reason}), SLO "
                         f"{'met' if r.slo_ok else 'missed'}: window TTFT {r.ttft_window_s:.2f} s")
    for r in runs:
        util = " ".join(f"{k}={v['mean']:.2f}/{v['max']:.2f}" for k, v in r.link_util.items())
        lines.append(f"  {r.mode} link util mean/max: {util}")
    for r in runs:
        lines.append(f"  {r.mode} CNIC lanes: " + format_lanes(r))
    return "\n".join(lines)


def format_lanes(r: SimResult) -> str:
    """Model traffic per CNIC class and what sharing cost each lane."""
    parts = []
    for k, v in r.lanes.items():
        if v["model_gb"] or v["kv_gb"]:
            parts.append(f"{k} model {v['model_gb']:.0f} GB, KV {v['kv_gb']:.0f} GB slowed x{v['kv_slowdown']:.2f}, "
                         f"model slowed x{v['model_slowdown']:.4f}")
    return "; ".join(parts) or "no traffic"
