"""Results of a run: JCT, latency distributions, link traffic and balance.

Owns SimResult (the JSON shape of one run) and how it is computed from a finished
Simulation; knows nothing about how the run was driven.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from shared.messages.codes import LoadMode

SLO_TTFT_S = 4.0
SLO_TPOT_S = 0.050
WINDOW_S = 150.0


@dataclass
class SimResult:
    mode: LoadMode
    jct_s: float  # offline: time the last agent finished; online: simulated span
    requests: int
    agents_done: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_mean_s: float
    ttft_window_s: float  # online: mean TTFT of requests arriving in the last 150 s
    slo_ok: bool
    snic_read_gb: list[float]  # per node, prefill nodes first
    snic_write_gb: list[float]
    snic_max_over_avg: float  # per-node SNIC read traffic, max / mean over all nodes
    attn_max_over_avg: float  # per forward step across a PE node's GPUs (MoE), else per engine
    link_util: dict[str, dict[str, float]] = field(default_factory=dict)
    events: int = 0
    wall_s: float = 0.0
    events_per_s: float = 0.0
    alpha: int = 0
    beta: int = 0

    def to_dict(self) -> dict:
        return asdict(self)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def _max_over_avg(xs) -> float:
    xs = np.asarray(xs, dtype=float)
    return float(xs.max() / xs.mean()) if xs.size and xs.mean() > 0 else float("nan")


def collect(sim, span: float, wall: float) -> SimResult:
    c = sim.c
    nodes = c.nodes
    reads = [n.snic_r.bytes / 1e9 for n in nodes]
    writes = [n.snic_w.bytes / 1e9 for n in nodes]
    if sim.prefill.steps:
        attn = sim.prefill.attn_ratio_sum / sim.prefill.steps
    else:
        attn = _max_over_avg([e.attn_s for e in c.pes])
    ttft = sim.ttft
    window = _window_ttft(sim, span)
    tpot_mean = float(np.mean(sim.tpot)) if sim.tpot else float("nan")
    res = SimResult(
        mode=sim.cfg.mode, jct_s=span, requests=sim.finished, agents_done=sim.agents_done,
        ttft_p50_s=_pct(ttft, 50), ttft_p90_s=_pct(ttft, 90), ttft_p99_s=_pct(ttft, 99),
        ttft_mean_s=float(np.mean(ttft)) if ttft else float("nan"),
        tpot_p50_s=_pct(sim.tpot, 50), tpot_p90_s=_pct(sim.tpot, 90), tpot_mean_s=tpot_mean,
        ttft_window_s=window, slo_ok=window <= SLO_TTFT_S and not tpot_mean > SLO_TPOT_S,
        snic_read_gb=reads, snic_write_gb=writes,
        snic_max_over_avg=_max_over_avg(reads) if sim.cfg.mode.moves_kv else float("nan"),
        attn_max_over_avg=attn, link_util=_link_util(c, span), events=sim.events,
        wall_s=wall, events_per_s=sim.events / wall if wall > 0 else 0.0,
        alpha=sim.th.alpha, beta=sim.th.beta)
    return res


def _window_ttft(sim, span: float) -> float:
    """Mean TTFT of requests that arrived in the last WINDOW_S; requests still waiting
    for their first token at the end count with their wait so far."""
    lo = span - WINDOW_S
    done = [t for a, t in zip(sim.t_arrive, sim.ttft) if a >= lo]
    waiting = [span - r.t_arrive for r in sim.sched.reqs.values() if r.t_arrive >= lo]
    for e in sim.c.pes:
        waiting += [span - r.t_arrive for r in e.queue if r.t_arrive >= lo]
    xs = done + waiting
    return float(np.mean(xs)) if xs else float("nan")


def _link_util(c, span: float) -> dict[str, dict[str, float]]:
    """Mean and max utilisation of each link class, per role."""
    out: dict[str, dict[str, float]] = {}
    for role, nodes in (("p", c.pe_nodes), ("d", c.de_nodes)):
        engines = [e for n in nodes for e in n.engines]
        for name, links in (("snic_r", [n.snic_r for n in nodes]), ("snic_w", [n.snic_w for n in nodes]),
                            ("dram", [n.dram for n in nodes]), ("cnic_r", [e.cnic_r for e in engines]),
                            ("cnic_w", [e.cnic_w for e in engines])):
            u = [link.utilisation(span) for link in links]
            out[f"{role}.{name}"] = {"mean": float(np.mean(u)), "max": float(np.max(u))}
    return out
