"""How fast the simulator runs: CPU seconds per run and per request, beside the speed targets."""
from __future__ import annotations

import argparse
import time

from dualpath.sim import fast
from dualpath.sim.config import SimConfig

TARGET_2P4D_S = 10.0  # 2P4D, 2000 agents
TARGET_48P96D_S = 300.0  # 48P96D, 48K agents: 24x the agents, so about 24x the requests


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--agents", type=int, default=2000)
    p.add_argument("--scale", type=float, default=1.0, help="shrink trajectory lengths")
    p.add_argument("--mode", default="dualpath")
    p.add_argument("--topology", default="2P4D", help="<P>P<D>D")
    p.add_argument("--pure", action="store_true", help="pure Python even when a fresh compiled build exists")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    a = p.parse_args(argv)
    build = "pure Python (--pure)" if a.pure else fast.activate()
    from dualpath.sim.engine import run_sim
    cpu, wall = time.process_time(), time.perf_counter()
    from dualpath.sim.cli import parse_topology
    P, D = parse_topology(a.topology)
    r = run_sim(SimConfig(agents=a.agents, scale=a.scale, mode=a.mode, P=P, D=D))
    cpu, wall = time.process_time() - cpu, time.perf_counter() - wall
    per_req = cpu / r.requests
    print(f"build: {build}")
    print(f"{a.topology} {a.mode} agents={a.agents} scale={a.scale:g}: {r.requests} requests, {r.events} events, "
          f"{cpu:.1f} s CPU ({wall:.1f} s wall), {per_req * 1e6:.0f} us/request, {r.events / cpu:,.0f} events/s")
    if a.agents == 2000 and a.scale == 1.0 and (P, D) == (2, 4):
        print(f"  target {TARGET_2P4D_S:.0f} s: measured/target {cpu / TARGET_2P4D_S:.2f} "
              f"(the target allows {TARGET_2P4D_S / r.requests * 1e6:.0f} us/request)")
        big = 24 * r.requests * per_req
        print(f"  48P96D, 48K agents at this cost per request: ~{big / 60:.0f} CPU-min; target "
              f"{TARGET_48P96D_S / 60:.0f} min: measured/target {big / TARGET_48P96D_S:.2f}")
    return 0


if __name__ == "__main__":  # one benchmark at a time; its load and CPU said at the end
    from shared.benchrun import alone

    raise SystemExit(alone("dualpath.sim.speed", lambda conditions: main()))
