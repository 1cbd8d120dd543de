"""A benchmark's run conditions: one benchmark at a time on this machine, and the load it ran under."""
from __future__ import annotations

import fcntl
import json
import os
import platform
import shlex
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Iterator


def lock_path() -> Path:
    """The machine-wide lock file (DUALPATH_BENCH_LOCK overrides it)."""
    return Path(os.environ.get("DUALPATH_BENCH_LOCK", "/tmp/dualpath-bench.lock"))

QUIET_LOAD = 1.5  # a figure taken at a load average above this is not a figure


class BenchBusy(RuntimeError):
    def __init__(self, holder: dict):
        super().__init__(f"another benchmark holds {lock_path()}: pid {holder.get('pid')} "
                         f"({holder.get('name', '?')}, since {holder.get('since', '?')}); run one at a time")
        self.holder = holder


def machine() -> dict:
    """The machine a run ran on: CPU model, cores (all, and those this process may use), memory."""
    cpu = platform.processor() or platform.machine()
    mem = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") if hasattr(os, "sysconf") else 0
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name")) or cpu
    except (OSError, StopIteration):
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {"cpu": cpu, "cores": os.cpu_count(), "usable_cores": usable, "memory_gib": round(mem / 2**30, 1),
            "system": f"{platform.system()} {platform.release()}", "python": platform.python_version()}

CLI = "dualpath"  # the console script's name


def command_line(argv: list[str] | None = None) -> str:
    """The run's command as typed from the repository root: `.venv/bin/dualpath bench ...` or
    `.venv/bin/python -m dualpath.bench.fleet ...` (the path the venv was reached by dropped)."""
    argv = list(sys.argv if argv is None else argv)
    spec = getattr(sys.modules.get("__main__"), "__spec__", None)
    if argv and spec is not None and spec.name and argv[0].endswith(".py"):  # run with python -m
        head = [".venv/bin/python", "-m", spec.name.removesuffix(".__main__")]
    elif argv and Path(argv[0]).name == CLI:
        head = [".venv/bin/dualpath"]
    else:
        head = [".venv/bin/python", argv[0]] if argv and argv[0].endswith(".py") else argv[:1]
    return shlex.join(head + argv[1:])


@dataclass
class Conditions:
    """A run's record (`report()`: a report's "conditions"): start, machine, command, load, CPU."""

    name: str
    load_start: list[float] = field(default_factory=list)
    load_end: list[float] = field(default_factory=list)
    wall_s: float = 0.0
    cpu_s: float = 0.0  # this process and the children it reaped (a mesh it started included)
    others_load: float = 0.0  # the 1-minute load average at the end beyond this run's own cores
    flagged: str = ""  # why the figures are not figures ("": quiet)
    date: str = field(default_factory=lambda: datetime.now().astimezone().isoformat(timespec="seconds"))  # start
    machine: dict = field(default_factory=machine)
    command: str = field(default_factory=command_line)
    argv: list[str] = field(default_factory=lambda: list(sys.argv))
    _t0: float = field(default_factory=time.monotonic, repr=False)
    _c0: float = field(default_factory=lambda: _cpu(), repr=False)

    def measure(self) -> "Conditions":
        self.wall_s, self.cpu_s, self.load_end = time.monotonic() - self._t0, _cpu() - self._c0, _load()
        own = self.cpu_s / self.wall_s if self.wall_s > 0 else 0.0
        self.others_load = round(max(0.0, (self.load_end[0] if self.load_end else 0.0) - own), 2)
        self.flagged = judge(self)
        return self

    def line(self) -> str:
        loads = f"load average {self.load_start[0]:.2f} -> {self.load_end[0]:.2f}" if self.load_end else "load n/a"
        verdict = f"NOT QUIET: {self.flagged}" if self.flagged else "quiet"
        return f"{self.name}: {loads}; CPU {self.cpu_s:.1f} s over {self.wall_s:.1f} s wall; {verdict}"

    def report(self) -> dict:
        return {k: v for k, v in asdict(self).items() if not k.startswith("_")}


def _load() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def _cpu() -> float:
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system + _running_descendants_cpu()


def _running_descendants_cpu() -> float:
    """CPU seconds of this process's descendants still running (a mesh the run has not stopped yet)."""
    tick, parent, cpu = os.sysconf("SC_CLK_TCK"), {}, {}
    for d in Path("/proc").glob("[0-9]*"):
        try:
            f = (d / "stat").read_text().rsplit(")", 1)[1].split()  # after the name: state, ppid, ...
        except (OSError, IndexError):
            continue
        parent.setdefault(int(f[1]), []).append(int(d.name))
        cpu[int(d.name)] = sum(int(x) for x in f[11:15]) / tick  # utime, stime, cutime, cstime
    total, todo = 0.0, list(parent.get(os.getpid(), []))
    while todo:
        pid = todo.pop()
        total += cpu.get(pid, 0.0)
        todo += parent.get(pid, [])
    return total


def judge(c: Conditions) -> str:
    """Why the run's figures do not count ("" when quiet): busy at its start, or others' load beyond 1.5."""
    if c.load_start and c.load_start[0] > QUIET_LOAD:
        return f"load average {c.load_start[0]:.2f} at the start (> {QUIET_LOAD})"
    if c.others_load > QUIET_LOAD:
        return f"load average beyond this run's own work reached {c.others_load:.2f} (> {QUIET_LOAD})"
    return ""


@contextmanager
def bench_run(name: str, say=None) -> Iterator[Conditions]:
    """Hold the machine-wide lock while the block runs (BenchBusy if taken); fills the yielded `Conditions` at the end."""
    lock = lock_path()
    lock.touch(exist_ok=True)
    with open(lock, "r+") as f:
        try:
            fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise BenchBusy(_holder(f)) from None
        f.seek(0)
        f.truncate()
        f.write(json.dumps({"pid": os.getpid(), "name": name, "since": time.strftime("%Y-%m-%d %H:%M:%S")}))
        f.flush()
        cond = start(name)
        try:
            yield cond
        finally:
            cond.measure()
            (say or (lambda line: print(line, file=sys.stderr, flush=True)))(cond.line())


def start(name: str) -> Conditions:
    """A run's conditions from now, without the lock (a tool that is no benchmark of the mesh)."""
    return Conditions(name, load_start=_load())


def _holder(f) -> dict:
    try:
        f.seek(0)
        return json.loads(f.read() or "{}")
    except (OSError, ValueError):
        return {}


def alone(name: str, body):
    """`body(conditions)` under the lock; a busy machine is a message naming the holder and exit code 2."""
    try:
        with bench_run(name) as cond:
            return body(cond)
    except BenchBusy as exc:
        print(f"{name}: {exc}", file=sys.stderr, flush=True)
        return 2
