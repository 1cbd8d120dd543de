"""Results of a run: JCT, latency distributions (TTFT, TTST, TPOT), the online verdict, link traffic.

Owns SimResult (one run's JSON shape) and its computation from a finished Simulation.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import numpy as np

from shared.messages.codes import LoadMode


@dataclass
class SimResult:
    mode: str  # a LoadMode, or the simulator-only "sglang" baseline (config.SGLANG)
    jct_s: float  # offline: time the last agent finished; online: simulated span
    requests: int
    agents_done: int
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    ttft_mean_s: float
    ttst_p50_s: float  # time to the second token
    ttst_p90_s: float
    tpot_p50_s: float
    tpot_p90_s: float
    tpot_mean_s: float
    slo_ok: bool  # online: the stop rule's verdict (offline: False)
    stop_reason: str  # online: "ttft over SLO" | "tpot over SLO" | "steady" | "cap"; offline: "done"
    run_s: float  # simulated seconds the run lasted
    ttft_window_s: float  # online: TTFT of the deciding window
    snic_read_gb: list[float]  # per node, prefill nodes first
    snic_write_gb: list[float]
    snic_max_over_avg: float  # per-node SNIC read traffic, max / mean over all nodes
    attn_max_over_avg: float  # per forward step across a step unit's GPUs (MoE), else per engine
    pe_busy: float  # share of the span the prefill step units spend in forward steps (mean over units)
    pe_compute: float  # of the span, the share those steps compute (pe_busy less the wait on layerwise loads)
    de_batch: float  # mean decode batch per decode engine over the span
    de_busy: float  # share of the span a decode engine runs a batch, stepping or stalled (mean over engines)
    link_util: dict[str, dict[str, float]] = field(default_factory=dict)
    lanes: dict[str, dict[str, float]] = field(default_factory=dict)  # CNIC class -> model GB, slowdowns
    # attention max/avg apart (prefill.AttnBalance): steps the quota cut on every GPU ("cut_ratio", their
    # "cut_share") and the rest ("uncut_ratio"); the GPUs' mean attention per step
    # ("mean_attn_s"); the share of step time a GPU waits on the slowest one's attention
    # ("wait_share"); attention summed over the run per GPU, max/avg ("run_ratio")
    attn_balance: dict[str, float] = field(default_factory=dict)
    # without layerwise prefill (prefill.HbmCap): the KV a prefill GPU's HBM holds ("tokens", "gb"), the
    # step units' steps, those where it cut some GPU's batch ("cut_steps", "cut_share"), the per-GPU
    # "batches" and "cut_batches", and "over": batches of one request that alone exceeds it; {} with layerwise
    hbm_cap: dict[str, float] = field(default_factory=dict)
    windows: list = field(default_factory=list)  # online: (end s, TTFT s, TPOT s) per judged window
    events: int = 0
    wall_s: float = 0.0
    events_per_s: float = 0.0
    alpha: int = 0
    beta: int = 0
    hints: str = "off"  # agents that hinted their tool calls (prefetch): off | on | mixed
    after_tool: dict[str, float] = field(default_factory=dict)  # TTFT p50/p99 of turns after a tool call
    prefetched_gb: float = 0.0
    prefetch_late: int = 0  # turns back before their prefetch had finished reading

    def to_dict(self) -> dict:
        return asdict(self)


def _pct(xs: list[float], q: float) -> float:
    return float(np.percentile(xs, q)) if xs else float("nan")


def _mean(xs) -> float:
    return float(np.mean(xs)) if xs else float("nan")


def _max_over_avg(xs) -> float:
    xs = np.asarray(xs, dtype=float)
    return float(xs.max() / xs.mean()) if xs.size and xs.mean() > 0 else float("nan")


def collect(sim, span: float, wall: float) -> SimResult:
    c = sim.c
    nodes = c.nodes
    reads = [n.snic_r.bytes / 1e9 for n in nodes]
    writes = [n.snic_w.bytes / 1e9 for n in nodes]
    balance = sim.prefill.attn.figures()
    if balance["steps"]:
        attn = balance["ratio"]
    else:
        attn = _max_over_avg([e.attn_s for e in c.pes])
    ttft = sim.ttft
    v = sim.judge.verdict if sim.judge is not None else None
    tpot_mean = float(np.mean(sim.tpot)) if sim.tpot else float("nan")
    return SimResult(
        mode=sim.cfg.mode, jct_s=span, requests=sim.finished, agents_done=sim.agents_done,
        ttft_p50_s=_pct(ttft, 50), ttft_p90_s=_pct(ttft, 90), ttft_p99_s=_pct(ttft, 99),
        ttft_mean_s=float(np.mean(ttft)) if ttft else float("nan"),
        ttst_p50_s=_pct(sim.ttst, 50), ttst_p90_s=_pct(sim.ttst, 90),
        tpot_p50_s=_pct(sim.tpot, 50), tpot_p90_s=_pct(sim.tpot, 90), tpot_mean_s=tpot_mean,
        slo_ok=bool(v and v.ok), stop_reason=v.reason if v else ("done" if not sim.online else "ran out of agents"),
        run_s=span, ttft_window_s=v.ttft_s if v else float("nan"),
        snic_read_gb=reads, snic_write_gb=writes,
        snic_max_over_avg=_max_over_avg(reads) if sim.cfg.mode != LoadMode.ORACLE else float("nan"),
        attn_max_over_avg=attn, attn_balance={**balance, "run_ratio": _run_ratio(c),
                                                      "quota_tokens": _quota_tokens(sim)}, pe_busy=_mean([u.busy_s / span for u in c.units]) if span > 0 else 0.0,
        hbm_cap=sim.prefill.hbm.figures(sim.model.kv_bytes),
        pe_compute=_mean([u.compute_s / span for u in c.units]) if span > 0 else 0.0,
        de_batch=_mean([e.decode.batch_s / span for e in c.des]) if span > 0 else 0.0,
        de_busy=_mean([e.decode.busy_s / span for e in c.des]) if span > 0 else 0.0, link_util=_link_util(c, span), lanes=_lanes(c),
        windows=[list(w) for w in v.windows] if v else [], events=sim.events,
        wall_s=wall, events_per_s=sim.events / wall if wall > 0 else 0.0,
        alpha=sim.th.alpha, beta=sim.th.beta, hints=sim.cfg.hints, after_tool=_after_tool(sim),
        prefetched_gb=sim.pf.bytes / 1e9 if sim.pf else 0.0, prefetch_late=sim.pf.late if sim.pf else 0)


def _after_tool(sim) -> dict[str, float]:
    """TTFT percentiles of the turns that followed a tool call, hinted and unhinted agents apart."""
    out = {}
    for name, hinted in (("hinted", True), ("unhinted", False)):
        xs = [t for h, t in getattr(sim, "ttft_after_tool", []) if h == hinted]
        if xs:
            out.update({f"{name}_turns": float(len(xs)), f"{name}_ttft_p50_s": _pct(xs, 50),
                        f"{name}_ttft_p99_s": _pct(xs, 99)})
    return out


def _quota_tokens(sim) -> int:
    """About how many new tokens of a request 32K into its context fill the compute quota."""
    one = sim.model.attention.request_time(32768, 1)
    return int(sim.cfg.quota_s / one) if one > 0 else 0


def _run_ratio(c) -> float:
    """Attention time summed over the run per GPU, max/avg inside each step unit (mean over units)."""
    xs = [_max_over_avg([e.attn_s for e in u.engines]) for u in c.units if len(u.engines) > 1]
    xs = [x for x in xs if x == x]
    return _mean(xs) if xs else _max_over_avg([e.attn_s for e in c.pes])


def _link_util(c, span: float) -> dict[str, dict[str, float]]:
    """Mean and max utilisation (KV) of each link class, per role."""
    out: dict[str, dict[str, float]] = {}
    for role, nodes in (("p", c.pe_nodes), ("d", c.de_nodes)):
        engines = [e for n in nodes for e in n.engines]
        for name, links in (("snic_r", [n.snic_r for n in nodes]), ("snic_w", [n.snic_w for n in nodes]),
                            ("dram", [n.dram for n in nodes]), ("cnic_r", [e.cnic_r for e in engines]),
                            ("cnic_w", [e.cnic_w for e in engines])):
            u = [link.utilisation(span) for link in links]
            out[f"{role}.{name}"] = {"mean": float(np.mean(u)), "max": float(np.max(u))}
    return out


def _lanes(c) -> dict[str, dict[str, float]]:
    """Per CNIC class: model GB, KV GB, and each lane's slowdown (time taken / time alone)."""
    out = {}
    for role, engines in (("p", c.pes), ("d", c.des)):
        for name in ("cnic_r", "cnic_w"):
            links = [getattr(e, name) for e in engines]
            busy, kv_time = sum(x.busy for x in links), sum(x.kv_time for x in links)
            ideal, took = sum(x.hi_ideal for x in links), sum(x.hi_time for x in links)
            out[f"{role}.{name}"] = {
                "model_gb": sum(x.hi_bytes for x in links) / 1e9, "kv_gb": sum(x.bytes for x in links) / 1e9,
                "kv_slowdown": kv_time / busy if busy else 1.0, "model_slowdown": took / ideal if ideal else 1.0}
    return out
