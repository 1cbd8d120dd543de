"""`dualpath bench`: replay agent traces against a mesh; offline JCT or online SLO capacity.

Modes run one after another on one mesh, in their own time windows and rotating order, each on
fresh token contents. Wiring only: runs.py orders the runs, replay.py and usage.py measure,
metrics.py and bound.py compute, report.py writes.
"""
from __future__ import annotations

import argparse
import os
import random
import re
import signal
import sys
import tempfile
import threading
import time
from typing import TYPE_CHECKING

from shared.benchrun import BenchBusy, bench_run
from shared.messages.codes import BENCH_MODES, LoadMode, mode_names, parse_modes

if TYPE_CHECKING:
    from dualpath.bench.vllm_metrics import Spec


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
    p.add_argument("--modes", default=",".join(BENCH_MODES),
                   help=f"comma-separated load modes, one run each ({', '.join(mode_names())})")
    p.add_argument("--repeat", type=int, default=1,
                   help="runs of every mode (offline) or of every load level (online); figures are their medians")
    p.add_argument("--aps-start", type=float, default=0.5, help="--search-aps: first level")
    p.add_argument("--search-steps", type=int, default=8, help="--search-aps: at most this many load levels per mode")
    p.add_argument("--search-precision", type=float, default=0.1,
                   help="--search-aps: bisect until the failing level is within this share of the holding one")
    p.add_argument("--min-turns", type=int, default=0,
                   help="online: turns per run at least (more agents than --agents when needed)")
    p.add_argument("--min-seconds", type=float, default=0.0,
                   help="online: a level's arrivals span at least this many seconds (at least APS x this many "
                        "agents), so a level is judged on sustained load, not on a burst the queues absorb")
    p.add_argument("--slo-ttft", type=float, default=4.0, help="SLO on TTFT in seconds (steady mean; a run "
                                                                "whose last 8 turns average more is stopped)")
    p.add_argument("--slo-tpot", type=float, default=0.050, help="SLO on TPOT in seconds (steady mean)")
    p.add_argument("--slo-warmup", type=float, default=0.2, help="share of a run's first turns left out of its verdict")
    p.add_argument("--slo-target", type=float, default=0.9, help="attainment shown beside the verdict (share of "
                                                                  "turns meeting both)")
    p.add_argument("--metric-percentiles", default="99",
                   help="comma-separated percentiles of the vLLM-named figures (as `vllm bench serve` takes "
                        "them): 50,90,99 gives p50_/p90_/p99_ keys in each run's JSON")
    p.add_argument("--goodput", nargs="+", default=[], metavar="KEY:MS",
                   help="SLOs of request_goodput (requests/s meeting every one), as `vllm bench serve` takes "
                        "them: ttft, tpot and e2el in ms, e.g. --goodput ttft:500 tpot:50")
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
    args.vllm = _vllm_spec(args)
    if args.scale is None:
        args.scale = 0.05 if args.trace.startswith("gen:") else 1.0
    if not 0 < args.scale <= 1:
        raise CliError(f"--scale must be in (0, 1], got {args.scale}")
    if args.aps is not None and args.aps <= 0:
        raise CliError("--aps must be > 0")
    if args.repeat < 1:
        raise CliError(f"--repeat must be >= 1, got {args.repeat}")
    if not 0 < args.search_precision < 1:
        raise CliError(f"--search-precision must be in (0, 1), got {args.search_precision}")
    if args.tool_calls < 0:
        raise CliError(f"--tool-calls must be >= 0, got {args.tool_calls}")
    if args.min_seconds < 0 or args.min_turns < 0:
        bad = ("--min-seconds", args.min_seconds) if args.min_seconds < 0 else ("--min-turns", args.min_turns)
        raise CliError(f"{bad[0]} must be >= 0, got {bad[1]:g}")
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
    extra = {"scheduler": {"liveness-timeout-s": "5"}}
    if args.snic_gbit:
        extra["storage_gateway"] = {"snic-read-gbps": str(args.snic_gbit), "snic-write-gbps": str(args.snic_gbit)}
    for service, key, value in _settings(args.set):
        extra.setdefault(service, {})[key] = value
    try:
        with bench_run("dualpath bench") as args.conditions:
            return _bench_up(args, modes, topo, extra) if args.up else _bench(args, args.url, modes)
    except BenchBusy as exc:
        raise CliError(str(exc)) from None


def _vllm_spec(args: argparse.Namespace) -> Spec:
    """--metric-percentiles and --goodput, read as `vllm bench serve` reads them."""
    from dualpath.bench.vllm_metrics import Spec, parse_goodput, parse_percentiles
    from dualpath.cli import CliError

    try:
        percentiles = parse_percentiles(args.metric_percentiles)
    except ValueError as exc:
        raise CliError(f"--metric-percentiles: {exc}") from None
    try:
        return Spec(percentiles, parse_goodput(args.goodput))
    except ValueError as exc:
        raise CliError(f"--goodput: {exc}") from None


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


class _Interrupts:
    """SIGTERM and SIGINT (even if SIGINT was ignored at start) raise KeyboardInterrupt once, so the
    mesh this bench started is stopped; while stopping they are ignored."""

    SIGNALS = (signal.SIGINT, signal.SIGTERM)

    def __init__(self) -> None:
        self.armed = True
        main = threading.current_thread() is threading.main_thread()  # handlers live in the main thread only
        self.before = {sig: signal.signal(sig, self._on_signal) for sig in self.SIGNALS} if main else {}

    def _on_signal(self, *_) -> None:
        if self.armed:
            self.armed = False
            raise KeyboardInterrupt

    def disarm(self) -> None:
        self.armed = False

    def restore(self) -> None:
        for sig, handler in self.before.items():
            signal.signal(sig, handler)


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
    interrupts = _Interrupts()
    try:
        mesh.start(timeout=300, progress=lambda line: print(line, file=sys.stderr, flush=True))
        code = _bench(args, mesh.url, modes, tuple(p.popen.pid for p in mesh.procs if p.name.startswith("nats")))
        failed = code != 0
        return code
    except MeshError as exc:
        print(f"dualpath bench: {exc}", file=sys.stderr)
        return 1
    finally:
        interrupts.disarm()  # a second signal while stopping must not leave children running
        mesh.stop()
        interrupts.restore()
        shutil.rmtree(f"{tmp}/store", ignore_errors=True)
        if failed and not args.log_dir:
            print(f"dualpath bench: the mesh's logs are kept in {logs}", file=sys.stderr)
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def _bench(args: argparse.Namespace, url: str, modes: list[LoadMode], extra_pids: tuple[int, ...] = ()) -> int:
    from dataclasses import replace

    import httpx

    from dualpath.bench import hints as agent_hints
    from dualpath.bench import report
    from dualpath.bench.metrics import Slo, summary
    from dualpath.bench.runs import RunPlan, Runner, agents_for_level
    from dualpath.bench.scrape import Scraper
    from dualpath.bench.workload import jobs, load, token_range, with_hints

    mesh = httpx.get(url + "/v1/mesh", timeout=10).json()
    lo, hi = token_range(mesh["model"], mesh["vocab_size"])
    turns_per_agent = args.max_turns or 1_000_000
    base_agents = args.agents or (None if not args.trace.startswith("gen:") else 4)
    agents_for = lambda aps: agents_for_level(aps, args.min_seconds, args.min_turns, base_agents or 0,  # noqa: E731
                                              turns_per_agent)
    top = args.aps if args.aps is not None else (args.aps_start * 2 ** args.search_steps if args.search_aps else 0)
    most = max(base_agents or 0, agents_for(0), agents_for(top)) or None
    wl = load(args.trace, most, args.scale, args.seed, args.time_scale, args.tool_calls)
    nonce = random.SystemRandom().randrange(1 << 30)  # fresh token contents: nothing from an earlier run hits
    runs_done = [0]
    lengths: dict[str, list] = {}  # mode -> the (append, gen) turns of each job it replayed (for the prediction)

    def fresh_jobs(mode: LoadMode, n_agents: int, hints: str = "off") -> list:
        """This run's copy of the workload, on new token contents so no run hits another's KV."""
        runs_done[0] += 1
        src = replace(wl, agents=wl.agents[:n_agents]) if n_agents and wl.agents else wl  # build only what runs
        js = _cap_turns(jobs(src, mode, lo, hi, nonce + runs_done[0], mesh.get("max_context") or 0), args.max_turns)
        js = with_hints(js[:n_agents] if n_agents else js, hints)
        lengths[mode] = [[(len(a), g) for a, g in j.turns] for j in js]
        return js
    cap = _capacity(args, url, mesh, lo, hi, extra_pids)
    slo = Slo(args.slo_ttft, args.slo_tpot, args.slo_target, args.slo_warmup)
    doc = {"trace": args.trace, "config": {
        "model": mesh["model"], "url": url, "agents": base_agents or len(wl.agents or wl.mooncake),
        "scale": args.scale, "max_turns": args.max_turns or None, "repeat": args.repeat,
        "snic_gbit_s_per_node": args.snic_gbit or None, "prefill_tok_s": _r(cap.prefill_tps),
        "decode_s_per_tok": _r(cap.tpot_s, 4), "prefill_nodes": cap.prefill_nodes, "decode_nodes": cap.decode_nodes,
        "cores": cap.cores, "data_plane_gb_s": _r((cap.data_plane_bytes_per_s or 0) / 1e9, 2),
        "block_size": mesh.get("block_size"), "load_average": _loadavg(), "node_roles": report.node_roles(mesh),
        "tool_call_scale": args.tool_calls or None, "metric_percentiles": args.metric_percentiles,
        "goodput": " ".join(args.goodput) or None}, "runs": []}
    plan = RunPlan(url, fresh_jobs, slo, cap, not args.no_progress, args.timeout, mesh.get("block_size") or 64,
                extra_pids, tuple(args.hint_runs), bool(args.tool_calls), args.vllm)
    with Scraper(url) as scraper, agent_hints.TMScraper(url) as tms, Runner(plan, scraper, tms) as runner:
        n = base_agents or 0
        if args.offline:
            runner.offline(modes, n, args.repeat)
        elif args.aps is not None:
            runner.fixed(modes, args.aps, agents_for(args.aps), args.repeat, args.seed)
        else:
            doc["search"] = runner.search(modes, args.aps_start, agents_for, args.repeat, args.seed,
                                          args.search_precision, args.search_steps)
    doc["runs"] = runner.rows
    doc["config"]["kv_bytes_per_block"] = runner.bytes_per_token * (mesh.get("block_size") or 64) or None
    doc["config"]["load_average_after"] = _loadavg()
    if any("hinted_turns" in r for r in doc["runs"]):
        doc["hint_ratios"] = agent_hints.ratios(doc["runs"])
        doc["hint_ratios_each"] = agent_hints.ratios_each(doc["runs"])
    if args.data_plane:
        from shared.transport.bench import figures

        print("measuring the data plane (tcp, shm) ...", file=sys.stderr, flush=True)
        doc["data_plane"] = figures()
    if args.offline and not args.tool_calls:  # the prediction replays turns back to back: no tool calls
        from dualpath.bench.predict import add_predictions

        add_predictions(doc, cap, mesh, _settings(args.set), args.snic_gbit, lengths)
    doc["summary"] = summary(doc["runs"])
    return _output(doc, args)


def _output(doc: dict, args: argparse.Namespace) -> int:
    """The report (markdown, its files, the JSON) with the run's conditions; the exit code."""
    from dualpath.bench import report

    if getattr(args, "conditions", None) is not None:
        doc["conditions"] = args.conditions.measure().report()
    doc = report.clean(doc)
    if args.report:
        print(report.write_report(doc, args.report))
    else:
        print(report.markdown(doc))
    if args.json:
        report.write_json(doc, args.json)
    return 1 if any(r["errors"] for r in doc["runs"] if r["kind"] == "offline") else 0


def _loadavg() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


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
            raise CliError(f"--set {item!r}: {service} has no setting {key!r} (see docs/reference/settings.md)")
        out.append((service, key.replace("_", "-"), m[3]))
    return out


def _cap_turns(js: list, max_turns: int) -> list:
    from dataclasses import replace

    return [replace(j, turns=j.turns[:max_turns]) for j in js] if max_turns else js


def _r(v, digits: int = 1):
    return None if v is None else round(v, digits)


def _capacity(args, url: str, mesh: dict, lo: int, hi: int, extra_pids: tuple[int, ...] = ()):
    from dualpath.bench import replay
    from dualpath.bench.bound import MeshCapacity

    engines = [e for e in mesh.get("engines", []) if e.get("alive", True)]
    p_nodes = {e["node"] for e in engines if e.get("role") == "prefill"}
    d_nodes = {e["node"] for e in engines if e.get("role") == "decode"}
    tps = tpot = rates = None
    if not args.no_probe:
        n = min(256, max(64, (mesh.get("max_context") or 512) // 4))
        rates = replay.probe_rates(url, lo, hi, n_prompt=n, n_gen=16, batch=8, repeat=5,
                                   long_ctx=min(1024, (mesh.get("max_context") or 2048) // 2))
        tps = n / (rates["turn_overhead_s"] + n / rates["prefill_tok_s"])  # a whole fresh prompt's rate
        tpot = rates["decode_step_s"]
    rate = args.snic_gbit * 1e9 / 8 if args.snic_gbit else None
    local = args.up or url.startswith(("http://127.", "http://localhost"))
    if rates is not None and local and args.offline and not args.tool_calls:  # what the prediction needs
        from dualpath.bench.corun import corun_rates
        from dualpath.bench.kvcpu import probe_mesh

        print("probing each engine beside the other (a prefill while a batch decodes) ...", file=sys.stderr, flush=True)
        rates.update(corun_rates(url, lo, hi, rates))
        print("probing the KV path's CPU (without KV, then with KV on both paths) ...", file=sys.stderr, flush=True)
        block_bytes = max((e.get("kv_block_bytes") or 0 for e in engines), default=0)
        rates.update(probe_mesh(url, lo, hi, mesh.get("max_context") or 0, extra_pids,
                                block_bytes / (mesh.get("block_size") or 64), rate, rates["prefill_tok_s"]))
    return MeshCapacity(read_bytes_per_s=rate, prefill_nodes=len(p_nodes) or 1, decode_nodes=len(d_nodes) or 1,
                    prefill_engines=sum(1 for e in engines if e.get("role") == "prefill") or 1,
                    prefill_tps=tps, tpot_s=tpot, write_bytes_per_s=rate,
                    cores=len(os.sched_getaffinity(0)) if local else 0,
                    data_plane_bytes_per_s=_memcpy_rate() if local else None, rates=rates)


def _memcpy_rate() -> float:
    """Bytes per second of one large memcpy here (the shm data plane's ceiling): best of 3."""
    import numpy as np

    src = np.ones(64 << 20, np.uint8)
    dst = np.empty_like(src)
    best = float("inf")
    for _ in range(3):
        t0 = time.perf_counter()
        np.copyto(dst, src)
        best = min(best, time.perf_counter() - t0)
    return src.nbytes / best
