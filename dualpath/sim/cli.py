"""`dualpath sim`: run the cluster simulator, the paper reproduction, or the P/D window.

Heavy imports happen inside `run`, so `dualpath --help` stays fast.
"""
from __future__ import annotations

import argparse
import re

from dualpath.sim.config import SGLANG, SIM_MODES, parse_sim_modes
from dualpath.sim.efficiency import DECODE_EFF, PREFILL_EFF
from shared.messages.codes import COMPARED, LoadMode
from shared.sched.policy.read_path import NEAR_TIE


def register(subparsers) -> None:
    p = subparsers.add_parser("sim", help="discrete-event cluster simulation with the real policy",
                              description=__doc__.splitlines()[0])
    p.add_argument("--model", default="ds-v3.2-660b", help="ds-v3.2-660b | ds-27b | qwen2.5-32b | config.json path")
    p.add_argument("--hardware", default="h800", help="h800 | dgx-h100")
    p.add_argument("--topology", default="2P4D", help="<P>P<D>D, e.g. 2P4D or 48P96D")
    p.add_argument("--trace", default="gen:64k", help="gen:32k|gen:48k|gen:64k[:N base] or a JSONL path")
    p.add_argument("--agents", type=int, default=500, help="agent trajectories replayed (offline: all at t=0)")
    load = p.add_mutually_exclusive_group()
    load.add_argument("--offline", action="store_true", help="all agents start at t=0 (default); report JCT")
    load.add_argument("--aps", type=float, default=0.0, help="online: agents per second (Poisson); 0 = offline")
    p.add_argument("--duration", type=float, default=0.0,
                   help="online: at most this many simulated seconds (0: the stop rule's cap, 2 x --steady-lag + "
                        "--window)")
    p.add_argument("--window", type=float, default=150.0, help="online: SLO window, s")
    p.add_argument("--steady-lag", type=float, default=1800.0,
                   help="online: steady state = a window's TTFT within 5%% of the window this long before, s")
    p.add_argument("--modes", default=",".join(COMPARED),
                   help=f"comma-separated load modes, one run each ({', '.join(SIM_MODES)}; {SGLANG}: an "
                        "SGLang + Mooncake-style baseline the simulator alone models)")
    p.add_argument("--assign", default="policy", choices=("policy", "rr"),
                   help="engine assignment: the scheduler's policy, or round-robin (the balance figure's baseline)")
    p.add_argument("--read-near-tie", type=float, default=NEAR_TIE, metavar="FRACTION",
                   help="dualpath mode: read queues within FRACTION of the longer one count as a tie, "
                        "going to the node given fewer tokens (0 = exact ties only)")
    _layerwise_args(p)
    p.add_argument("--model-traffic", type=float, default=1.0,
                   help="scale of the model's collectives on the CNICs (EP all-to-all, TP all-reduce); 0 = none")
    p.add_argument("--pe-ep-nodes", type=int, default=2, help="nodes of one prefill EP domain (step unit)")
    p.add_argument("--de-ep-nodes", type=int, default=4, help="nodes of one decode EP domain")
    p.add_argument("--attn-tp", type=int, default=1, help="attention TP degree (1 = attention DP)")
    p.add_argument("--scale", type=float, default=1.0, help="shrink trajectory lengths (keeps hit ratio)")
    p.add_argument("--seed", type=int, default=0, help="trace and arrival seed")
    p.add_argument("--pull", type=float, default=0.05, help="group pull period, s")
    p.add_argument("--quota", type=float, default=0.3, help="intra-PE compute quota, s")
    p.add_argument("--attn-balance", type=float, default=0.0, metavar="RATIO",
                   help="cut a prefill EP domain's batches so its GPUs' attention max/avg stays within RATIO; 0 = off")
    p.add_argument("--think", type=float, default=0.0, help="seconds between a turn and the next")
    p.add_argument("--tool-calls", type=float, default=0.0, metavar="SCALE",
                   help="a tool call between turns: the trace's tool_ms (or generated, median 2 s) times SCALE")
    p.add_argument("--hints", default="off",
                   help="comma-separated: off, on (every agent hints its tool calls: prefetch), mixed (every "
                        "other agent); one run each per mode (oracle: off only)")
    p.add_argument("--json", dest="json_path", help="write {config, runs: [...]} here")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")
    p.add_argument("--reproduce", action="store_true",
                   help="the paper's published figures beside simulated ones (docs/concepts/design.md#published-figures); "
                        "--quick shrinks every run (tens of minutes on 2 shared cores), the default size is far longer")
    p.add_argument("--ablation", action="store_true",
                   help="the paper's ablation: JCT change as each technique is added, beside the published one")
    _efficiency_args(p)
    p.add_argument("--quick", action="store_true", help="with --reproduce or --ablation: smaller runs")
    p.add_argument("--full", action="store_true", help="with --reproduce: include 48P96D / 48K agents")
    p.add_argument("--no-online", action="store_true",
                   help="with --reproduce: skip the online capacity search (its costliest part)")
    p.add_argument("--pd-window", action="store_true",
                   help="P/D window sweep per hardware preset (docs/concepts/design.md#the-pd-ratio-window)")
    p.set_defaults(func=run)


def _layerwise_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--no-layerwise", action="store_true",
                   help="load each request's stored KV into HBM before its compute (no layerwise overlap)")
    p.add_argument("--pe-free-hbm", type=float, default=0.0, metavar="GB",
                   help="without layerwise: HBM per prefill GPU for its batch's whole KV (0 = 90%% of HBM less "
                        "its weights and 4 GB); also with --ablation")


def _efficiency_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--fit-efficiency", action="store_true",
                   help="refit the engines' efficiency (the simulator's one fitted input) to the paper's 2P4D row")
    p.add_argument("--prefill-eff", type=float, default=PREFILL_EFF, metavar="SHARE",
                   help="share of the kernels' published rates a prefill engine reaches (default: the fitted one)")
    p.add_argument("--decode-eff", type=float, default=DECODE_EFF, metavar="SHARE",
                   help="share of the kernels' published rates a decode engine reaches (default: the fitted one)")


def _fit_efficiency() -> int:
    """Refit the efficiencies on the paper's 2P4D DS-660B offline row and print the constants to keep."""
    from dataclasses import replace

    from dualpath.sim import efficiency as eff
    from dualpath.sim.config import SimConfig
    from dualpath.sim.engine import run_sim

    base = SimConfig(model="ds-v3.2-660b", P=2, D=4, trace="gen:64k", agents=eff.FIT_AGENTS)
    print(f"fitting the engines' efficiency: DS-660B 2P4D, {eff.FIT_AGENTS} agents offline, dualpath/oracle JCT "
          f"<= {eff.FIT_TARGET} (production shares prefill {eff.PROD_PREFILL}, decode {eff.PROD_DECODE})", flush=True)
    scale, _ = eff.fit(lambda m, pe, de: run_sim(replace(base, mode=m, prefill_eff=pe, decode_eff=de)).jct_s,
                       say=lambda s: print(s, flush=True))
    pe, de = eff.effs(scale)
    print(f"fitted: SCALE = {scale:.4f} -> prefill {pe:.4f}, decode {de:.4f} (dualpath/sim/efficiency.py)")
    return 0


def parse_topology(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)P(\d+)D", text.strip(), flags=re.IGNORECASE)
    if not m or int(m.group(1)) < 1 or int(m.group(2)) < 1:
        from dualpath.cli import CliError
        raise CliError(f"--topology must look like 2P4D, got {text!r}")
    return int(m.group(1)), int(m.group(2))


def run(args: argparse.Namespace) -> int:
    from dualpath.sim.fast import activate
    activate()  # the compiled core when a fresh build exists (make sim-fast), else pure Python
    if args.pd_window:
        from dualpath.sim.hardware import HARDWARE, load_hardware
        from dualpath.sim.window import format_report, sweep
        names = [args.hardware] if args.hardware != "h800" else list(HARDWARE)
        for name in names:
            print(format_report(sweep(load_hardware(name))))
        return 0
    from shared.benchrun import start
    args.conditions = start("dualpath sim")  # the record its JSON carries
    if args.reproduce:
        from dualpath.sim.reproduce import main as reproduce
        return reproduce(quick=args.quick, full=args.full, json_path=args.json_path, online=not args.no_online,
                         conditions=args.conditions)
    if args.fit_efficiency:
        return _fit_efficiency()
    if args.ablation:
        from dualpath.sim.ablation import main as ablation
        ablation(quick=args.quick, pe_free_hbm_gb=args.pe_free_hbm)
        return 0
    return _simulate(args)


def _simulate(args: argparse.Namespace) -> int:
    import json

    from dualpath.sim.config import SimConfig
    from dualpath.sim.engine import run_sim
    from dualpath.sim.report import format_hints, format_runs

    P, D = parse_topology(args.topology)
    base = dict(model=args.model, hardware=args.hardware, P=P, D=D, trace=args.trace,
                agents=args.agents, scale=args.scale, seed=args.seed, aps=args.aps,
                duration_s=args.duration if args.aps > 0 else 0.0, assign=args.assign, read_near_tie=args.read_near_tie,
                pull_s=args.pull, quota_s=args.quota, attn_balance=args.attn_balance, think_s=args.think,
                tool_calls=args.tool_calls,
                layerwise=not args.no_layerwise, pe_free_hbm_gb=args.pe_free_hbm, model_traffic=args.model_traffic, pe_ep_nodes=args.pe_ep_nodes,
                de_ep_nodes=args.de_ep_nodes, attn_tp=args.attn_tp, window_s=args.window,
                prefill_eff=args.prefill_eff, decode_eff=args.decode_eff,
                steady_lag_s=args.steady_lag, progress=not args.no_progress)
    try:
        modes = parse_sim_modes(args.modes)
    except ValueError as exc:
        from dualpath.cli import CliError
        raise CliError(f"--modes: {exc}") from None
    hints = [h.strip() for h in args.hints.split(",") if h.strip()] or ["off"]
    try:
        cfgs = [SimConfig(mode=m, hints=h, **base) for m in modes for h in (["off"] if m == LoadMode.ORACLE else hints)]
    except ValueError as exc:
        from dualpath.cli import CliError
        raise CliError(str(exc)) from None
    runs = [run_sim(c) for c in cfgs]
    print(format_runs(runs, title=f"{args.model} {args.topology} {args.hardware} {args.trace} "
                                  f"agents={args.agents}" + (f" aps={args.aps}" if args.aps else " offline")))
    if any(r.after_tool for r in runs):
        print(format_hints(runs))
    if args.json_path:
        with open(args.json_path, "w", encoding="utf-8") as fh:
            json.dump({"config": base, "runs": [r.to_dict() for r in runs],
                       "conditions": args.conditions.measure().report()}, fh, indent=1)
    return 0
