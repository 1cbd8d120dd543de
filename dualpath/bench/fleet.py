"""Fleet benchmark: one real scheduler and a real NATS around thousands of emulated engines.

Per fleet size one row: assignments per second, arrival-to-assignment latency, scheduler CPU
per request, bus messages per second and the other processes' CPU.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import sys

from dualpath.fleet.driver import Fleet, FleetSpec
from dualpath.fleet.front import drive_core
from shared.benchrun import Conditions, start

COLUMNS = (
    ("engines", "engines", "{:d}"), ("req/s want", "target_rate", "{:.1f}"), ("assign/s", "assign_per_s", "{:.1f}"),
    ("p50 ms", "assign_p50_ms", "{:.1f}"), ("p99 ms", "assign_p99_ms", "{:.1f}"),
    ("sched p50", "sched_wait_p50_ms", "{:.2f}"), ("sched p99", "sched_wait_p99_ms", "{:.2f}"),
    ("sched ms/req", "sched_cpu_ms_per_req", "{:.2f}"), ("net ms/req", "sched_net_ms_per_req", "{:.2f}"),
    ("sched cores", "sched_cores", "{:.2f}"), ("idle cores", "sched_idle_cores", "{:.3f}"),
    ("front ms/req", "front_cpu_ms_per_req", "{:.2f}"), ("front cores", "front_cores", "{:.2f}"),
    ("bus msg/s", "bus_msgs_per_s", "{:.0f}"), ("sched in/s", "sched_in_msgs_per_s", "{:.0f}"),
    ("sched out/s", "sched_out_msgs_per_s", "{:.0f}"), ("front in/s", "front_in_msgs_per_s", "{:.0f}"), ("emul cores", "emulator_cores", "{:.2f}"),
    ("nats cores", "nats_cores", "{:.2f}"), ("agent cores", "agents_cores", "{:.2f}"), ("load", "loadavg", "{:.1f}"),
    ("failed", "failed", "{:d}"),
)


CORE_COLUMNS = (
    ("engines", "engines", "{:d}"), ("req/s want", "target_rate", "{:.0f}"), ("submit/s", "submitted_per_s", "{:.0f}"),
    ("assign/s", "assign_per_s", "{:.0f}"), ("p50 ms", "assign_p50_ms", "{:.1f}"), ("p99 ms", "assign_p99_ms", "{:.1f}"),
    ("max ms", "assign_max_ms", "{:.0f}"), ("in core p50", "core_wait_p50_ms", "{:.2f}"),
    ("in core p99", "core_wait_p99_ms", "{:.2f}"), ("in flight", "in_flight", "{:d}"), ("core cores", "core_cores", "{:.2f}"),
    ("idle cores", "idle_cores", "{:.3f}"), ("core ms/req", "core_ms_per_req", "{:.3f}"),
    ("net ms/req", "core_net_ms_per_req", "{:.3f}"), ("core in/s", "core_in_msgs_per_s", "{:.0f}"),
    ("core out/s", "core_out_msgs_per_s", "{:.0f}"), ("nats cores", "nats_cores", "{:.2f}"),
    ("driver cores", "driver_cores", "{:.2f}"), ("emul cores", "emulator_cores", "{:.2f}"), ("load", "loadavg", "{:.1f}"),
    ("never assigned", "never_assigned", "{:d}"),
)


def table(rows: list[dict], columns=COLUMNS) -> str:
    head = " | ".join(c[0] for c in columns)
    lines = [f"| {head} |", "|" + "|".join("---" for _ in columns) + "|"]
    for r in rows:
        lines.append("| " + " | ".join(fmt.format(r[key]) for _, key, fmt in columns) + " |")
    return "\n".join(lines)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m dualpath.bench.fleet", description=__doc__.split("\n\n")[0])
    p.add_argument("--engines", type=int, nargs="+", default=[96, 384, 1152], help="fleet sizes (multiples of 24)")
    p.add_argument("--load", type=float, default=0.05, help="fraction of the paper's per-engine agent load")
    p.add_argument("--groups", type=int, default=2, help="emulator processes")
    p.add_argument("--trace", default="64k", choices=("32k", "48k", "64k"), help="trace generator preset")
    p.add_argument("--warmup-s", type=float, default=20.0)
    p.add_argument("--measure-s", type=float, default=30.0)
    p.add_argument("--idle-s", type=float, default=5.0, help="heartbeats only, before the load (0: skip)")
    p.add_argument("--front-workers", type=int, default=1,
                   help="the scheduler's front-door worker processes (0: its dispatch core serves the API too)")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a scheduler setting, e.g. journal=false (repeatable)")
    p.add_argument("--log-dir", default="", help="keep every process's log here")
    p.add_argument("--json", help="write {core_only, rows, conditions} here")
    p.add_argument("--profile", default="", help="write the scheduler's cProfile statistics to PATH.<engines>")
    p.add_argument("--core-only", action="store_true",
                   help="drive the dispatch core alone at --load x the paper's request rate: a synthetic front door "
                        "(no HTTP, no agents, no engine work; dualpath/fleet/front.py)")
    p.add_argument("--core-cpu", type=int, default=-1, metavar="CPU",
                   help="pin the scheduler's dispatch core to CPU and every other process of the run (NATS, "
                        "emulators, front-door workers, this driver) to the other CPUs (default: no pinning)")
    return p


def main(argv: list[str] | None = None, conditions: Conditions | None = None) -> int:
    p = build_parser()
    args = p.parse_args(argv)
    conditions = conditions or start("dualpath.bench.fleet")
    extra = {}
    for item in args.set:
        key, sep, value = item.partition("=")
        if not sep:
            p.error(f"--set {item!r}: expected KEY=VALUE")
        extra[key.replace("_", "-")] = value
    if args.core_only and args.front_workers < 1:
        p.error("--core-only drives the dispatch core as its front-door workers do: --front-workers must be >= 1")
    rows = []
    for n in args.engines:
        spec = FleetSpec(engines=n, groups=args.groups, load=args.load, trace=args.trace, warmup_s=args.warmup_s,
                         measure_s=args.measure_s, idle_s=args.idle_s, scheduler=extra,
                         front_workers=args.front_workers, core_cpu=args.core_cpu,
                         log_dir=f"{args.log_dir}/{n}" if args.log_dir else "",
                         profile=f"{args.profile}.{n}" if args.profile else "")
        try:
            spec.check()
        except ValueError as exc:
            p.error(str(exc))
        print(f"fleet of {n} engines: starting ...", file=sys.stderr, flush=True)
        with Fleet(spec) as fleet:
            row = asyncio.run(drive_core(fleet) if args.core_only else fleet.run_load())
        row["core_cpu"] = args.core_cpu
        rows.append(row)
        print(json.dumps({k: v for k, v in row.items() if k != "errors"}), file=sys.stderr, flush=True)
    print(table(rows, CORE_COLUMNS if args.core_only else COLUMNS))
    if args.json:
        with open(args.json, "w", encoding="utf-8") as fh:
            json.dump({"core_only": args.core_only, "rows": rows, "conditions": conditions.measure().report()},
                      fh, indent=1)
    return 0


if __name__ == "__main__":  # one benchmark at a time; its load and CPU said at the end
    from shared.benchrun import alone

    raise SystemExit(alone("dualpath.bench.fleet", lambda conditions: main(conditions=conditions)))
