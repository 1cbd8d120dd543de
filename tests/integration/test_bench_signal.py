"""`dualpath bench --up` stopped by a signal stops the mesh it started: no process outlives it.

Started as a background job is (SIGINT ignored) and sent SIGTERM while its mesh starts, the bench
used to die at once and leave nats-server and the storage gateways running."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _children(pid: int) -> set[int]:
    """Every live descendant of `pid` (from /proc)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parents[int(entry.name)] = int(fields[1])
    found, frontier = set(), {pid}
    while frontier:
        frontier = {c for c, p in parents.items() if p in frontier} - found
        found |= frontier
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")  # a zombie has exited; only its parent's reaping is left


def _wait(cond, what: str, limit_s: float = 180.0) -> None:
    """Poll until `cond()`; the limit only turns a hang into a failure."""
    end = time.monotonic() + limit_s
    while not cond():
        assert time.monotonic() < end, f"still waiting for {what}"
        time.sleep(0.05)


def test_sigterm_during_start_stops_every_child(tmp_path):
    logs = tmp_path / "logs"
    argv = [sys.executable, "-m", "dualpath", "bench", "--up", "--model", "tiny", "--trace", "gen:32k",
            "--agents", "2", "--scale", "0.02", "--max-turns", "2", "--offline", "--modes", "basic",
            "--no-probe", "--no-progress", "--log-dir", str(logs)]
    proc = subprocess.Popen(argv, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN))
    kids: set[int] = set()
    try:
        # nats-server, scheduler, and a node's gateway, traffic manager and engine: well into the start
        _wait(lambda: len(_children(proc.pid)) >= 5 or proc.poll() is not None, "the mesh's processes")
        assert proc.poll() is None, proc.stdout.read().decode()
        kids = _children(proc.pid)
        proc.send_signal(signal.SIGTERM)
        out, _ = proc.communicate(timeout=180)
        assert proc.returncode == 130, out.decode()
        _wait(lambda: not any(_alive(k) for k in kids), "the mesh's processes to end")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for k in kids:  # whatever a failed run left behind
            if _alive(k):
                os.kill(k, signal.SIGKILL)
