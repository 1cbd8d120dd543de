"""The fleet benchmark's driver: NATS, the real scheduler, emulator processes, agents, measurement.

Owns one run at one fleet size; its figures are the differences between snapshots taken after
`warmup_s` and after `measure_s` more (/proc, the scheduler's metrics, NATS's /varz and /connz).
"""
from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
import uuid
from dataclasses import dataclass, field
from pathlib import Path

import msgspec

from dualpath.fleet.agents import AgentLoad
from dualpath.fleet.group import fleet_layout
from dualpath.fleet.procs import children, children_cpu_s, cpu_s, set_affinity
from dualpath.fleet.timing import FleetTiming
from dualpath.mesh import nats_server_binary
from dualpath.traces import generate, trace_stats
from shared.bus import Bus
from shared.http import bind_socket
from shared.kv.hashing import block_hashes
from shared.messages.endpoints import EP
from shared.messages.fleet import StoredKeys

PAPER_ENGINES = 1152  # 48P96D: 144 nodes of 8 GPUs, one engine per GPU
PAPER_APS = 8.8  # agents per second the paper's 48P96D online run admits
PER_NODE = 8


@dataclass
class FleetSpec:
    engines: int = 96  # a multiple of 3 x PER_NODE: a third prefill, two thirds decode (the paper's 1:2)
    groups: int = 2  # emulator processes
    load: float = 0.05  # fraction of the paper's per-engine agent load
    trace: str = "64k"
    model: str = "ds-v3.2-660b"
    hardware: str = "h800"
    warmup_s: float = 20.0
    measure_s: float = 30.0
    heartbeat_s: float = 0.5
    idle_s: float = 5.0  # before the load: the scheduler's CPU with heartbeats only (0: skip)
    time_scale: float = 1.0  # wall seconds per modelled second of engine work (tests: < 1)
    seed: int = 0
    front_workers: int = 1  # the scheduler's front-door worker processes (0: its dispatch core serves HTTP too)
    scheduler: dict[str, str] = field(default_factory=dict)  # extra scheduler flags
    log_dir: str = ""
    profile: str = ""  # write the scheduler's cProfile statistics here (it runs slower)
    core_cpu: int = -1  # pin the dispatch core to this CPU and every other process of the run to the rest (-1: none)

    @property
    def nodes(self) -> tuple[int, int]:
        n = self.engines // PER_NODE
        return n // 3, n - n // 3

    def check(self) -> None:
        if self.engines < 3 * PER_NODE or self.engines % (3 * PER_NODE):
            raise ValueError(f"engines {self.engines}: a multiple of {3 * PER_NODE} (a third prefill nodes of "
                             f"{PER_NODE})")
        if not 0 < self.load <= 10 or self.groups < 1 or self.measure_s <= 0 or self.warmup_s < 0 or \
                not self.time_scale > 0:
            raise ValueError("load in (0, 10], groups >= 1, measure_s > 0, warmup_s >= 0 and time_scale > 0")
        if self.core_cpu >= 0:
            cpus = os.sched_getaffinity(0)
            if self.core_cpu not in cpus or len(cpus) < 2:
                raise ValueError(f"core_cpu {self.core_cpu}: one of this process's CPUs {sorted(cpus)}, with at "
                                 "least one left for the rest of the run")


def _get(url: str, timeout: float = 60.0) -> bytes:
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return r.read()


def histogram(text: str, name: str) -> list[tuple[float, float]]:
    """Cumulative (le, count) pairs of a Prometheus histogram in /metrics text."""
    out = []
    prefix = name + "_bucket{"
    for line in text.splitlines():
        if line.startswith(prefix):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            out.append((float("inf") if le == "+Inf" else float(le), float(line.rsplit(" ", 1)[1])))
    return sorted(out)


def hist_quantile(before: list, after: list, q: float) -> float:
    """Quantile of the observations between two snapshots, interpolated inside its bucket."""
    counts = [(le, a - dict(before).get(le, 0.0)) for le, a in after]
    total = counts[-1][1] if counts else 0
    if total <= 0:
        return float("nan")
    want, lo, prev = q * total, 0.0, 0.0
    for le, c in counts:
        if c >= want:
            if le == float("inf"):
                return lo
            return lo + (le - lo) * (want - prev) / max(c - prev, 1e-9)
        lo, prev = le, c
    return lo


def percentile(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    v = sorted(values)
    return v[min(len(v) - 1, int(q * len(v)))]


def paper_rate(spec: FleetSpec, stats) -> tuple[float, float]:
    """(agents/s, requests/s) at `spec.load` x the paper's per-engine agent load (`stats`: the trace's)."""
    aps = PAPER_APS * spec.engines / PAPER_ENGINES * spec.load
    return aps, aps * stats.turns


class Fleet:
    def __init__(self, spec: FleetSpec):
        spec.check()
        self.spec = spec
        self.ns = "fl" + uuid.uuid4().hex[:8]
        self.dir = Path(spec.log_dir or tempfile.mkdtemp(prefix="dualpath-fleet-"))
        self.dir.mkdir(parents=True, exist_ok=True)
        self.procs: dict[str, subprocess.Popen] = {}
        self.nats_url = self.monitor = self.url = ""
        self.sock = None
        self.affinity: set[int] | None = None  # the driver's own, while the run is pinned

    def _spawn(self, name: str, argv: list[str], pass_fds: tuple[int, ...] = ()) -> subprocess.Popen:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "OTEL_SDK_DISABLED": os.environ.get("OTEL_SDK_DISABLED", "")}
        with open(self.dir / f"{name}.log", "ab") as log:  # the child keeps its own descriptor
            p = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env=env,
                                 pass_fds=pass_fds, cwd=os.getcwd())
        self.procs[name] = p
        return p

    def start(self, timeout: float = 120.0) -> None:
        s = self.spec
        ports = self.dir / "nats-ports"
        ports.mkdir(exist_ok=True)
        nats = self._spawn("nats", [nats_server_binary(), "-a", "127.0.0.1", "-p", "-1", "-m", "-1",
                                    "--ports_file_dir", str(ports), "-js", "-sd", str(self.dir / "js")])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline and not self.monitor:
            for path in ports.glob(f"*_{nats.pid}.ports"):
                try:
                    doc = json.loads(path.read_text())
                    self.nats_url, self.monitor = doc["nats"][0], doc["monitoring"][0]
                except (ValueError, KeyError, IndexError, OSError):
                    pass
            time.sleep(0.05)
        if not self.monitor:
            raise RuntimeError(f"nats-server reported no ports (log: {self.dir / 'nats.log'})")
        self.sock = bind_socket("127.0.0.1", 0, "port")
        port = self.sock.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        timing = FleetTiming.build(s.model, s.hardware, s.nodes[1] * PER_NODE)
        alpha, beta = timing.pe_thresholds(trace_stats(self.trajectories()).hit_ratio)
        flags = {"nats-url": self.nats_url, "namespace": self.ns, "node": "sched", "model": "smollm2",
                 "http-host": "127.0.0.1", "http-port": port, "http-fd": self.sock.fileno(),
                 "log-level": "warning", "pe-alpha-tokens": alpha, "pe-beta-tokens": beta,
                 "heartbeat-s": s.heartbeat_s, "front-workers": s.front_workers, **s.scheduler}
        argv = [sys.executable, *(["-m", "cProfile", "-o", s.profile] if s.profile else []), "-m", "services.scheduler"]
        for k, v in flags.items():
            argv += [f"--{k}", str(v)]
        self._spawn("scheduler", argv, pass_fds=(self.sock.fileno(),))
        n_pre, n_dec = s.nodes
        nodes = [f"p{i}:prefill:{PER_NODE}" for i in range(n_pre)] + [f"d{i}:decode:{PER_NODE}" for i in range(n_dec)]
        for g in range(s.groups):
            mine = nodes[g::s.groups]
            if not mine:
                continue
            self._spawn(f"group{g}", [sys.executable, "-m", "dualpath.fleet.group", "--nats-url", self.nats_url,
                                      "--namespace", self.ns, "--name", f"group{g}", "--nodes", ",".join(mine),
                                      "--model", s.model, "--hardware", s.hardware,
                                      "--decode-engines", str(n_dec * PER_NODE), "--heartbeat-s", str(s.heartbeat_s),
                                      "--time-scale", str(s.time_scale),
                                      "--out", str(self.dir)])
        self.wait_ready(n_pre * PER_NODE, n_dec * PER_NODE, timeout)
        if s.core_cpu >= 0:
            self.pin(s.core_cpu)

    def pin(self, cpu: int) -> None:
        """The dispatch core alone on `cpu`; NATS, the emulators, the workers and this driver elsewhere."""
        self.affinity = os.sched_getaffinity(0)
        rest = self.affinity - {cpu}
        core = self.procs["scheduler"].pid
        set_affinity(core, {cpu})
        for pid in [p.pid for n, p in self.procs.items() if n != "scheduler"] + children(core) + [os.getpid()]:
            set_affinity(pid, rest)

    def trajectories(self):
        return generate(self.spec.trace, 500, seed=self.spec.seed)

    def wait_ready(self, pes: int, des: int, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        doc: dict = {}
        while time.monotonic() < deadline:
            for name, p in self.procs.items():
                if p.poll() is not None:
                    raise RuntimeError(f"{name} exited with code {p.returncode} (log: {self.dir / (name + '.log')})")
            try:
                doc = json.loads(_get(self.url + "/health", 2))
            except urllib.error.HTTPError as exc:
                doc = json.loads(exc.read() or b"{}")
            except (OSError, ValueError):
                doc = {}
            if doc.get("prefill_engines") == pes and doc.get("decode_engines") == des:
                return
            time.sleep(0.5)
        raise RuntimeError(f"fleet not ready after {timeout:.0f} s: {doc} (want {pes} prefill, {des} decode)")

    # measurement ---------------------------------------------------------------------
    def snapshot(self) -> dict:
        varz = json.loads(_get(self.monitor + "/varz"))
        connz = json.loads(_get(self.monitor + "/connz?limit=4096"))
        conns = [c for c in connz.get("connections", []) if str(c.get("name", "")).startswith("scheduler")]
        sched = next((c for c in conns if not re.search(r"-w\d+$", c["name"])), {})  # the dispatch core's
        front = [c for c in conns if c is not sched]
        return {"t": time.monotonic(), "cpu": {n: cpu_s(p.pid) for n, p in self.procs.items()},
                "front_cpu": children_cpu_s(self.procs["scheduler"].pid),
                "front_in": sum(c.get("out_msgs", 0) for c in front),
                "self_cpu": time.process_time(), "load": os.getloadavg()[0],
                "bus_in": varz["in_msgs"], "bus_out": varz["out_msgs"], "bus_in_bytes": varz["in_bytes"],
                "sched_in": sched.get("out_msgs", 0), "sched_out": sched.get("in_msgs", 0),
                "sched_in_bytes": sched.get("out_bytes", 0), "sched_out_bytes": sched.get("in_bytes", 0),
                "metrics": _get(self.url + "/metrics").decode()}

    async def idle_cost(self) -> float:
        """Scheduler cores while only heartbeats arrive (the fleet's fan-in), over `idle_s`."""
        if self.spec.idle_s <= 0:
            return float("nan")
        pid, t0 = self.procs["scheduler"].pid, time.monotonic()
        c0 = cpu_s(pid)  # the dispatch core alone: workers see no heartbeats
        await asyncio.sleep(self.spec.idle_s)
        return (cpu_s(pid) - c0) / (time.monotonic() - t0)

    async def run_load(self) -> dict:
        s = self.spec
        idle = await self.idle_cost()
        trajs = self.trajectories()
        stats = trace_stats(trajs)
        timing = FleetTiming.build(s.model, s.hardware, s.nodes[1] * PER_NODE, scale=s.time_scale)
        aps, rate = paper_rate(s, stats)
        mean_gen = stats.gen
        turn = timing.turn_s(int(stats.context), int(stats.append), int(mean_gen))
        population = max(1, round(rate * turn))
        bus = await Bus.connect(self.nats_url, "fleet-agents", wait_s=10)
        layout = fleet_layout(s.model)

        async def stored(tokens: list[int]) -> None:
            keys = block_hashes(tokens, layout.block_size, layout.fingerprint)
            for i in range(0, len(keys), 20_000):
                await bus.publish(EP.FLEET_STORED.at(self.ns), StoredKeys("agents", keys[i:i + 20_000]))
            await bus.nc.flush()

        agents = AgentLoad(self.url, trajs, population, seed=s.seed, stored=stored)
        marks: dict = {}

        async def sample() -> None:
            await asyncio.sleep(s.warmup_s)
            marks["a"] = await asyncio.to_thread(self.snapshot)
            await asyncio.sleep(s.measure_s)
            marks["b"] = await asyncio.to_thread(self.snapshot)

        sampler = asyncio.create_task(sample())
        try:
            await agents.run(s.warmup_s + s.measure_s, ramp_s=min(turn, s.warmup_s or turn))
            await sampler
        finally:
            await bus.close()
        work_at = await self.dump()
        return self.figures(marks["a"], marks["b"], agents, work_at,
                            {"sched_idle_cores": idle, "aps": aps, "target_rate": rate, "population": population, "turn_s_est": turn,
                             "turns_mean": stats.turns, "context_mean": stats.context, "gen_mean": mean_gen})

    async def dump(self) -> dict[str, float]:
        bus = await Bus.connect(self.nats_url, "fleet-driver", wait_s=10)
        out: dict[str, float] = {}
        self.groups: list[dict] = []
        try:
            for name in [n for n in self.procs if n.startswith("group")]:
                await bus.request(EP.FLEET_DUMP.at(self.ns, name=name), StoredKeys("driver", []), timeout=30)
                doc = msgspec.msgpack.decode((self.dir / f"{name}.msgpack").read_bytes())
                out.update(doc.pop("work_at"))
                self.groups.append(doc)
        finally:
            await bus.close()
        return out

    def figures(self, a: dict, b: dict, agents: AgentLoad, work_at: dict, load: dict) -> dict:
        wall = b["t"] - a["t"]
        window = [t for t in agents.turns if a["t"] <= t.sent < b["t"]]
        assigned = [work_at[t.rid] - t.sent for t in window if t.rid in work_at]
        ok = [t for t in agents.turns if t.status == 200]
        cpu = {n: b["cpu"][n] - a["cpu"].get(n, 0.0) for n in b["cpu"]}
        groups_cpu = sum(v for n, v in cpu.items() if n.startswith("group"))
        name = "dualpath_scheduler_assign_wait_seconds"
        ha, hb = histogram(a["metrics"], name), histogram(b["metrics"], name)
        n_assigned = len(assigned)
        return {
            "engines": self.spec.engines, "load": self.spec.load, **load,
            "wall_s": wall, "requests_sent": len(window), "assigned": n_assigned,
            "assign_per_s": n_assigned / wall, "completed": len(ok), "failed": len(agents.turns) - len(ok),
            "short": sum(1 for t in ok if t.made != t.gen),  # completed with fewer tokens than asked
            "never_assigned": sum(1 for t in ok if t.rid not in work_at),  # no prefill engine saw it (must be 0)
            "errors": agents.errors,
            "assign_p50_ms": percentile(assigned, 0.5) * 1e3, "assign_p99_ms": percentile(assigned, 0.99) * 1e3,
            "sched_wait_p50_ms": hist_quantile(ha, hb, 0.5) * 1e3, "sched_wait_p99_ms": hist_quantile(ha, hb, 0.99) * 1e3,
            "sched_cores": cpu["scheduler"] / wall,
            "sched_cpu_ms_per_req": cpu["scheduler"] / max(1, n_assigned) * 1e3,
            "sched_net_ms_per_req": (cpu["scheduler"] - load["sched_idle_cores"] * wall) / max(1, n_assigned) * 1e3,
            "front_cores": (b["front_cpu"] - a["front_cpu"]) / wall,
            "front_cpu_ms_per_req": (b["front_cpu"] - a["front_cpu"]) / max(1, n_assigned) * 1e3,
            "front_in_msgs_per_s": (b["front_in"] - a["front_in"]) / wall,
            "nats_cores": cpu["nats"] / wall, "emulator_cores": groups_cpu / wall,
            "agents_cores": (b["self_cpu"] - a["self_cpu"]) / wall,
            "bus_msgs_per_s": (b["bus_in"] - a["bus_in"]) / wall,
            "bus_out_msgs_per_s": (b["bus_out"] - a["bus_out"]) / wall,
            "bus_mb_per_s": (b["bus_in_bytes"] - a["bus_in_bytes"]) / wall / 1e6,
            "sched_in_msgs_per_s": (b["sched_in"] - a["sched_in"]) / wall,
            "sched_out_msgs_per_s": (b["sched_out"] - a["sched_out"]) / wall,
            "sched_in_mb_per_s": (b["sched_in_bytes"] - a["sched_in_bytes"]) / wall / 1e6,
            "sched_out_mb_per_s": (b["sched_out_bytes"] - a["sched_out_bytes"]) / wall / 1e6,
            "loadavg": (a["load"] + b["load"]) / 2,
            "emulator_heartbeat_lag_ms": max((g["heartbeat_lag_s"] for g in self.groups), default=0.0) * 1e3,
            "tokens": sum(g["tokens"] for g in self.groups),
        }

    def stop(self, keep: bool = False) -> None:
        for name, p in self.procs.items():
            if name != "nats" and p.poll() is None:
                p.send_signal(signal.SIGTERM)
        for name, p in self.procs.items():
            if name == "nats":
                continue
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        nats = self.procs.get("nats")
        if nats is not None and nats.poll() is None:
            nats.terminate()
            try:
                nats.wait(10)
            except subprocess.TimeoutExpired:
                nats.kill()
                nats.wait()
        if self.sock is not None:
            self.sock.close()
            self.sock = None
        if self.affinity is not None:
            set_affinity(os.getpid(), self.affinity)
            self.affinity = None
        if not keep and not self.spec.log_dir:
            shutil.rmtree(self.dir, ignore_errors=True)

    def __enter__(self) -> "Fleet":
        try:
            self.start()
        except BaseException:
            self.stop(keep=True)
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop(keep=exc[0] is not None)
