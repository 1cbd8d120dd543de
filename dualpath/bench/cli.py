"""`dualpath bench`: replay agent traces against a mesh; offline JCT or online SLO capacity.

    dualpath bench --trace gen:32k --agents 4 --scale 0.05 --offline --modes basic,dualpath
    dualpath bench --up --model tiny --snic-gbit 0.2 --trace gen:32k --search-aps --report out/
    dualpath bench --up --model tiny --trace gen:32k --offline --tool-calls 1 --hints off,on,mixed \
        --modes dualpath,oracle

Modes run one after another on the same mesh, each in its own time window (so bytes
read per node are attributable to one mode), in a rotating order across load levels so
slow drift of the machine hits every mode alike; their token contents differ, so no mode
reuses another's stored KV. With `--up` the mesh's store and logs live in one temporary
directory, removed at the end; the logs stay (path printed) when the run failed, or go
where `--log-dir` says. Wiring only: measurement is in replay.py, numbers in metrics.py
and bound.py, output in report.py.
"""
from __future__ import annotations

import argparse
import random
import re
import sys
import tempfile
import time

from shared.messages.codes import COMPARED, LoadMode, mode_names, parse_modes


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="replay agent traces: offline JCT, online TTFT/TPOT and SLO capacity")
    p.add_argument("--trace", required=True, help="trajectory JSONL path, gen:32k|gen:48k|gen:64k, or mooncake:PATH")
    p.add_argument("--agents", type=int, default=0, help="agents (default: 4 for gen:, the whole file otherwise)")
    p.add_argument("--scale", type=float, default=None,
                   help="multiply every trace length, keeping the hit ratio (default 0.05 for gen:, else 1)")
    p.add_argument("--max-turns", type=int, default=0, help="replay at most this many turns per agent (0 = all)")
    p.add_argument("--time-scale", type=float, default=1.0, help="Mooncake: multiply recorded arrival times")
    p.add_argument("--seed", type=int, default=0, help="trace seed (token contents are fresh every run)")
    load = p.add_mutually_exclusive_group(required=True)
    load.add_argument("--offline", action="store_true", help="all agents start together; report JCT")
    load.add_argument("--aps", type=float, help="online: Poisson arrivals at this many agents per second")
    load.add_argument("--search-aps", action="store_true", help="online: find the highest APS that meets the SLO")
    p.add_argument("--tool-calls", type=float, default=0.0, metavar="SCALE",
                   help="agents run a tool call between turns: the trace's tool_ms (or generated ones, median 2 s) "
                        "times SCALE; 0 = none (turn i+1 starts when turn i ends)")
    p.add_argument("--hints", default="off",
                   help="comma-separated agent-hint policies, one run each per mode: off, on (every agent sends "
                        "agent_hints), mixed (every other agent); needs --tool-calls to matter")
    p.add_argument("--modes", default=",".join(COMPARED),
                   help=f"comma-separated load modes, one run each ({', '.join(mode_names())})")
    p.add_argument("--aps-start", type=float, default=0.5, help="--search-aps: first level")
    p.add_argument("--search-steps", type=int, default=4, help="--search-aps: load levels per mode")
    p.add_argument("--slo-ttft", type=float, default=4.0, help="SLO on TTFT in seconds")
    p.add_argument("--slo-tpot", type=float, default=0.050, help="SLO on TPOT in seconds")
    p.add_argument("--slo-target", type=float, default=0.9, help="share of turns that must meet the SLO")
    p.add_argument("--url", default="http://127.0.0.1:8000", help="a running mesh")
    p.add_argument("--up", action="store_true", help="start a mesh on this machine for the run")
    p.add_argument("--model", default="smollm2", help="--up: model preset, .gguf or HF directory")
    p.add_argument("--topology", default="1P1D", help="--up: prefill and decode nodes, e.g. 1P2D")
    p.add_argument("--kv-blocks", type=int, default=256, help="--up: KV blocks per engine")
    p.add_argument("--buffer-mb", type=int, default=256, help="--up: DRAM buffer per traffic manager (MB)")
    p.add_argument("--snic-gbit", type=float, default=0.0,
                   help="storage-NIC read/write cap per node in Gbit/s (--up: emulated; else: declared, for the "
                        "bound); 0 = uncapped")
    p.add_argument("--snic-gbs", dest="snic_gbs_old", type=float, metavar="GBIT",
                   help="deprecated: the old name of --snic-gbit (its value was always Gbit/s, not GB/s)")
    p.add_argument("--log-dir", default="", help="--up: keep the processes' logs here (empty: a temporary "
                                                 "directory, removed at the end unless the run failed)")
    p.add_argument("--set", action="append", default=[], metavar="SERVICE.KEY=VALUE",
                   help="--up: a service setting, e.g. scheduler.pe-beta-tokens=32768 (repeatable)")
    p.add_argument("--no-probe", action="store_true", help="skip measuring prefill/decode rates (bound loses terms)")
    p.add_argument("--json", help="write the JSON document here")
    p.add_argument("--report", help="write report.md, report.json and PNG plots into this directory")
    p.add_argument("--timeout", type=float, default=600.0, help="per-request timeout in seconds")
    p.add_argument("--no-progress", action="store_true", help="no progress bars on stderr")
    p.add_argument("--netns", action="store_true",
                   help="--up: hosts as network namespaces (root): KV between nodes over real tcp")
    p.add_argument("--link-gbps", type=float, default=0.0,
                   help="--up --netns: each node's link rate both ways in Gbit/s, enforced by tc (0 = unlimited)")
    p.add_argument("--link-latency-ms", type=float, default=0.0,
                   help="--up --netns: delay added to every packet a node sends, in ms")
    p.add_argument("--data-plane", action="store_true",
                   help="also measure the data plane (tcp vs raw socket, shm vs memcpy, latency class under bulk)")
    p.set_defaults(func=run)


def parse_topology(text: str) -> tuple[int, int]:
    m = re.fullmatch(r"(\d+)P(\d+)D", text.strip().upper())
    if not m or min(int(m[1]), int(m[2])) < 1:
        raise ValueError(f"--topology {text!r}: expected like 1P1D or 2P4D")
    return int(m[1]), int(m[2])


def run(args: argparse.Namespace) -> int:
    from dualpath.cli import CliError
    try:
        modes = parse_modes(args.modes)
    except ValueError as exc:
        raise CliError(f"--modes: {exc}") from None
    if args.scale is None:
        args.scale = 0.05 if args.trace.startswith("gen:") else 1.0
    if not 0 < args.scale <= 1:
        raise CliError(f"--scale must be in (0, 1], got {args.scale}")
    if args.aps is not None and args.aps <= 0:
        raise CliError("--aps must be > 0")
    if args.tool_calls < 0:
        raise CliError(f"--tool-calls must be >= 0, got {args.tool_calls}")
    from dualpath.bench.workload import HINTS
    args.hint_runs = [h.strip() for h in args.hints.split(",") if h.strip()]
    bad = [h for h in args.hint_runs if h not in HINTS] or ([] if args.hint_runs else ["(none)"])
    if bad:
        raise CliError(f"--hints: {bad[0]!r} is not one of {', '.join(HINTS)}")
    try:
        topo = parse_topology(args.topology)
    except ValueError as exc:
        raise CliError(str(exc)) from None
    _snic_flag(args)
    if (args.netns or args.link_gbps or args.link_latency_ms) and not args.up:
        raise CliError("--netns, --link-gbps and --link-latency-ms place a mesh this bench starts: add --up")
    if (args.link_gbps or args.link_latency_ms) and not args.netns:
        raise CliError("--link-gbps and --link-latency-ms shape namespace links: add --netns")
    if args.netns:
        from dualpath.netns.fabric import probe

        if why := probe():
            raise CliError(f"--netns: {why}")
    if not args.up:
        return _bench(args, args.url, modes)
    extra = {"scheduler": {"liveness-timeout-s": "5"}}
    if args.snic_gbit:
        extra["storage_gateway"] = {"snic-read-gbps": str(args.snic_gbit), "snic-write-gbps": str(args.snic_gbit)}
    for service, key, value in _settings(args.set):
        extra.setdefault(service, {})[key] = value
    return _bench_up(args, modes, topo, extra)


def _snic_flag(args: argparse.Namespace) -> None:
    """Fold the deprecated --snic-gbs into --snic-gbit, with a note."""
    from dualpath.cli import CliError

    if args.snic_gbs_old is None:
        return
    if args.snic_gbit and args.snic_gbit != args.snic_gbs_old:
        raise CliError(f"--snic-gbs {args.snic_gbs_old:g} and --snic-gbit {args.snic_gbit:g} disagree: "
                       "give only --snic-gbit")
    print("dualpath bench: --snic-gbs is deprecated, use --snic-gbit (same value: Gbit/s)", file=sys.stderr)
    args.snic_gbit = args.snic_gbs_old


def _bench_up(args: argparse.Namespace, modes: list[LoadMode], topo: tuple[int, int], extra: dict) -> int:
    """Start a mesh in a temporary directory (store + logs), bench it, stop it, clean up."""
    import shutil

    from dualpath.mesh import Mesh, MeshError, MeshSpec

    tmp = tempfile.mkdtemp(prefix="dualpath-bench-")
    logs = args.log_dir or f"{tmp}/logs"
    spec = MeshSpec(model=args.model, port=0, prefill=topo[0], decode=topo[1], kv_blocks=args.kv_blocks,
                    buffer_mb=args.buffer_mb, threads=1, store=f"{tmp}/store", log_dir=logs, extra=extra,
                    netns=args.netns, link_gbps=args.link_gbps, link_latency_ms=args.link_latency_ms)
    mesh = Mesh(spec)
    print(f"starting a {args.topology} mesh of {args.model} (logs in {logs}) ...", file=sys.stderr, flush=True)
    failed = True
    try:
        mesh.start(timeout=300, progress=lambda line: print(line, file=sys.stderr, flush=True))
        code = _bench(args, mesh.url, modes)
        failed = code != 0
        return code
    except MeshError as exc:
        print(f"dualpath bench: {exc}", file=sys.stderr)
        return 1
    finally:
        mesh.stop()
        shutil.rmtree(f"{tmp}/store", ignore_errors=True)
        if failed and not args.log_dir:
            print(f"dualpath bench: the mesh's logs are kept in {logs}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _bench(args: argparse.Namespace, url: str, modes: list[LoadMode]) -> int:
    import httpx

    from dualpath.bench import hints as agent_hints
    from dualpath.bench import replay, report
    from dualpath.bench.metrics import ApsSearch, Slo
    from dualpath.bench.scrape import Scraper
    from dualpath.bench.workload import jobs, load, token_range, with_hints

    mesh = httpx.get(url + "/v1/mesh", timeout=10).json()
    lo, hi = token_range(mesh["model"], mesh["vocab_size"])
    wl = load(args.trace, args.agents or None, args.scale, args.seed, args.time_scale, args.tool_calls)
    nonce = random.SystemRandom().randrange(1 << 30)  # fresh token contents: nothing from an earlier run hits
    runs_done = [0]

    def fresh_jobs(mode: LoadMode) -> list:
        """This run's copy of the workload: new token contents each run, so no run hits another's KV."""
        runs_done[0] += 1
        return _cap_turns(jobs(wl, mode, lo, hi, nonce + runs_done[0], mesh.get("max_context") or 0), args.max_turns)
    cap = _capacity(args, url, mesh, lo, hi)
    slo = Slo(args.slo_ttft, args.slo_tpot, args.slo_target)
    show = not args.no_progress
    doc = {"trace": args.trace, "config": {
        "model": mesh["model"], "url": url, "agents": len(wl.agents or wl.mooncake), "scale": args.scale,
        "max_turns": args.max_turns or None, "snic_gbit_s_per_node": args.snic_gbit or None,
        "prefill_tok_s": _r(cap.prefill_tps), "decode_s_per_tok": _r(cap.tpot_s, 4),
        "prefill_nodes": cap.prefill_nodes, "decode_nodes": cap.decode_nodes,
        "block_size": mesh.get("block_size"), "tool_call_scale": args.tool_calls or None}, "runs": []}
    kv_bytes_per_block = [0.0]
    hint_runs = args.hint_runs
    lengths: dict[str, list] = {}  # mode -> the (append, gen) turns of each job it replayed (for the prediction)
    with Scraper(url) as scraper, agent_hints.TMScraper(url) as tms:
        def measure(mode: LoadMode, aps: float | None, order: int, hints: str = "off") -> dict:
            js = with_hints(fresh_jobs(mode), hints)
            lengths[mode] = [[(len(a), g) for a, g in j.turns] for j in js]
            t0 = time.time()
            if aps is None:
                r = replay.offline(url, js, mode, show, args.timeout)
            else:
                r = replay.online(url, js, mode, aps, args.seed + order, show, args.timeout)
            time.sleep(scraper.period * 1.5)  # let the scraper see the run's last reads
            scraper.scrape_once()
            by_node, bpb = scraper.window(t0, time.time())
            if bpb:
                kv_bytes_per_block[0] = bpb
            row = _row(r, slo, by_node, scraper.series(t0, time.time()))
            if args.tool_calls or hints != "off":
                row["hints"] = hints
                row.update(agent_hints.turn_figures(r))
                pf = row["prefetch"] = tms.window(t0, time.time())
                pf["arrival_read_bytes"] = sum(by_node.values()) - pf["bulk_read_bytes"]
            doc["runs"].append(row)
            return row

        def policies(mode: LoadMode) -> list[str]:
            return ["off"] if mode == LoadMode.ORACLE else hint_runs  # oracle moves no KV: nothing to hint

        if args.offline:
            for mode in modes:
                for h in policies(mode):
                    measure(mode, None, 0, h)
        elif args.aps is not None:
            for mode in modes:
                for h in policies(mode):
                    measure(mode, args.aps, 0, h)
        else:
            searches = {m: ApsSearch(args.aps_start) for m in modes}
            for step in range(args.search_steps):
                order = modes[step % len(modes):] + modes[: step % len(modes)]  # rotate: drift hits all alike
                for mode in order:
                    aps = searches[mode].next()
                    row = measure(mode, aps, step)
                    searches[mode].record(aps, row["slo_attainment"] >= slo.target and row["errors"] == 0)
            doc["search"] = {m: s.best for m, s in searches.items()}
    _bounds(doc, cap, kv_bytes_per_block[0] or None, mesh.get("block_size") or 64)
    doc["ratios"] = report.ratios(doc)
    if any("hinted_turns" in r for r in doc["runs"]):
        doc["hint_ratios"] = agent_hints.ratios(doc["runs"])
    if args.data_plane:
        from shared.transport.bench import figures

        print("measuring the data plane (tcp, shm) ...", file=sys.stderr, flush=True)
        doc["data_plane"] = figures()
    if args.offline and not args.tool_calls:  # the prediction replays turns back to back: no tool calls
        from dualpath.bench.predict import add_predictions

        add_predictions(doc, cap, mesh, _settings(args.set), args.snic_gbit, lengths)
    doc = report.clean(doc)
    if args.report:
        print(report.write_report(doc, args.report))
    else:
        print(report.markdown(doc))
    if args.json:
        report.write_json(doc, args.json)
    return 1 if any(r["errors"] for r in doc["runs"]) else 0


CONFIGS = {  # --set SERVICE -> (module, config class): keys are checked before a mesh starts
    "scheduler": ("services.scheduler.config", "SchedulerConfig"),
    "prefill_engine": ("services.prefill_engine.config", "PrefillEngineConfig"),
    "decode_engine": ("services.decode_engine.config", "DecodeEngineConfig"),
    "traffic_manager": ("services.traffic_manager.config", "TrafficManagerConfig"),
    "storage_gateway": ("services.storage_gateway.config", "StorageGatewayConfig"),
}


def _settings(items: list[str]) -> list[tuple[str, str, str]]:
    """`--set scheduler.pe-beta-tokens=32768` -> ("scheduler", "pe-beta-tokens", "32768")."""
    import dataclasses
    import importlib

    from dualpath.cli import CliError

    out = []
    for item in items:
        m = re.fullmatch(r"([a-z_-]+)\.([a-z0-9_-]+)=(.*)", item.strip())
        service = m[1].replace("-", "_") if m else ""
        if not m or service not in CONFIGS:
            raise CliError(f"--set {item!r}: expected SERVICE.KEY=VALUE with SERVICE one of {', '.join(CONFIGS)}")
        module, cls = CONFIGS[service]
        fields = {f.name for f in dataclasses.fields(getattr(importlib.import_module(module), cls))}
        key = m[2].replace("-", "_")
        if key not in fields:
            raise CliError(f"--set {item!r}: {service} has no setting {key!r} (see docs/configuration.md)")
        out.append((service, key.replace("_", "-"), m[3]))
    return out


def _cap_turns(js: list, max_turns: int) -> list:
    from dataclasses import replace

    return [replace(j, turns=j.turns[:max_turns]) for j in js] if max_turns else js


def _r(v, digits: int = 1):
    return None if v is None else round(v, digits)


def _capacity(args, url: str, mesh: dict, lo: int, hi: int):
    from dualpath.bench import replay
    from dualpath.bench.bound import Capacity

    engines = [e for e in mesh.get("engines", []) if e.get("alive", True)]
    p_nodes = {e["node"] for e in engines if e.get("role") == "prefill"}
    d_nodes = {e["node"] for e in engines if e.get("role") == "decode"}
    tps = tpot = rates = None
    if not args.no_probe:
        n = min(256, max(64, (mesh.get("max_context") or 512) // 4))
        rates = replay.probe_rates(url, lo, hi, n_prompt=n, n_gen=8)
        tps = n / (rates["turn_overhead_s"] + n / rates["prefill_tok_s"])  # a whole fresh prompt's rate
        tpot = rates["decode_step_s"]
    return Capacity(read_bytes_per_s=args.snic_gbit * 1e9 / 8 if args.snic_gbit else None,
                    prefill_nodes=len(p_nodes) or 1, decode_nodes=len(d_nodes) or 1,
                    prefill_engines=sum(1 for e in engines if e.get("role") == "prefill") or 1,
                    prefill_tps=tps, tpot_s=tpot, rates=rates)


def _row(r, slo, by_node: dict, series: dict) -> dict:
    from dualpath.bench.metrics import summarise

    row = summarise(r, slo)
    row["storage_read_bytes_per_node"] = by_node
    row["storage_series"] = series
    row["_chains"] = _chains(r)
    return row


def _chains(r) -> list[list[tuple[int, int]]]:
    by_job: dict[str, list] = {}
    for t in sorted(r.turns, key=lambda t: (t.job, t.turn)):
        if not t.error:
            by_job.setdefault(t.job, []).append((t.prompt_tokens - t.cached_tokens, t.gen_tokens))
    return list(by_job.values())


def _bounds(doc: dict, cap, bytes_per_block: float | None, block: int) -> None:
    from dualpath.bench.bound import lower_bound

    doc["config"]["kv_bytes_per_block"] = bytes_per_block
    for row in doc["runs"]:
        chains = row.pop("_chains")
        if row["kind"] != "offline":
            row["jct_lower_bound_s"] = None
            continue
        hit_bytes = row["cached_tokens"] * (bytes_per_block or 0.0) / block
        miss = row["prompt_tokens"] - row["cached_tokens"]
        b = lower_bound(row["mode"], hit_bytes, miss, chains, cap)
        row["bound"] = b
        row["jct_lower_bound_s"] = b["bound_s"]
        row["jct_over_bound"] = row["jct_s"] / b["bound_s"] if b["bound_s"] else None
