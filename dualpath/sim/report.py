"""Plain-text tables of simulation results."""
from __future__ import annotations

from dualpath.sim.metrics import SimResult
from shared.messages.codes import LoadMode


def format_runs(runs: list[SimResult], title: str = "") -> str:
    basic = next((r.jct_s for r in runs if r.mode == LoadMode.BASIC), None)
    head = (f"{'mode':14} {'JCT s':>8} {'vs basic':>8} {'TTFT p50':>9} {'p90':>7} {'TPOT p50':>9} "
            f"{'SNIC max/avg':>12} {'attn max/avg':>12} {'events':>9} {'wall s':>7} {'ev/s':>8}")
    lines = [title, head] if title else [head]
    for r in runs:
        speed = f"{basic / r.jct_s:.2f}x" if basic and r.jct_s else "-"
        lines.append(f"{r.mode:14} {r.jct_s:8.0f} {speed:>8} {r.ttft_p50_s:9.2f} {r.ttft_p90_s:7.2f} "
                     f"{r.tpot_p50_s * 1e3:7.1f}ms {r.snic_max_over_avg:12.2f} {r.attn_max_over_avg:12.3f} "
                     f"{r.events:9d} {r.wall_s:7.1f} {r.events_per_s:8.0f}")
    for r in runs:
        util = " ".join(f"{k}={v['mean']:.2f}/{v['max']:.2f}" for k, v in r.link_util.items())
        lines.append(f"  {r.mode} link util mean/max: {util}")
    return "\n".join(lines)
