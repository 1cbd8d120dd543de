"""`dualpath up` keeps serving when one of its processes dies: each kind is killed with SIGKILL,
restarted with the same flags (the scheduler on the same HTTP socket, nats-server on the same
port), and a completion succeeds afterwards; only Ctrl-C stops the mesh, and then all of it.

One real `dualpath up` (tiny model, real nats-server, every service its own process) serves the
whole file; the tests run in file order and each waits for the observable sign of its restart:
a new pid among up's children, the restarted process's fresh announcement, /health 200.
"""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.integration.meshutil import wait_until

pytestmark = pytest.mark.integration

BODY = {"max_tokens": 4, "temperature": 0, "ignore_eos": True}
PROCESSES = 8  # nats-server, scheduler, 2 gateways, prefill + decode engine, 2 traffic-managers
# kind -> (what its command line contains, /v1/mesh table and row it announces as: (table, field, value))
KINDS = {
    "decode engine": (("services.decode_engine",), ("engines", "engine", "d1-e0")),
    "prefill engine": (("services.prefill_engine",), ("engines", "engine", "p0-e0")),
    "traffic manager": (("services.traffic_manager", "--engine d1-e0"), ("traffic_managers", "engine", "d1-e0")),
    "storage gateway": (("services.storage_gateway", "--node p0"), ("gateways", "node", "p0")),
    "scheduler": (("services.scheduler",), None),  # whoever answers on the port after the kill is the new one
    "nats-server": (("nats-server",), None),  # the sign: every service announces again through the new one
}


class Up:
    """A running `dualpath up`: its stdout collected line by line, its children found in /proc."""

    def __init__(self, tmp_path: Path):
        tmp = tmp_path / "tmpdir"
        tmp.mkdir()
        env = {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp), "DUALPATH_HEARTBEAT_S": "0.2",
               "DUALPATH_LIVENESS_TIMEOUT_S": "2"}
        self.tmp = tmp
        self.popen = subprocess.Popen([sys.executable, "-m", "dualpath.cli", "up", "--model", "tiny", "--port", "0",
                                       "--kv-blocks", "64"], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                      text=True, env=env, cwd=Path(__file__).parents[2])
        self.lines: list[str] = []
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()
        try:
            self.url = re.match(r"serving (\S+)", self.wait_line(r"^serving (\S+) ")).group(1)
        except BaseException:
            self.stop()
            raise

    def _read(self) -> None:
        for line in self.popen.stdout:
            self.lines.append(line.rstrip("\n"))

    def wait_line(self, pattern: str, start: int = 0) -> str:
        """The first line from index `start` on that matches `pattern` (waits for it; fails if up exits)."""
        def found():
            hit = next((ln for ln in self.lines[start:] if re.search(pattern, ln)), None)
            if hit is None and self.popen.poll() is not None and not self._reader.is_alive():
                pytest.fail(f"dualpath up exited ({self.popen.returncode}) before {pattern!r}:\n" +
                            "\n".join(self.lines))
            return hit
        return wait_until(found, f"a line matching {pattern!r} from dualpath up", 120)

    def children(self) -> dict[int, str]:
        """pid -> command line of every live child of `dualpath up`."""
        out = {}
        for entry in Path("/proc").iterdir():
            try:
                stat = (entry / "stat").read_text()
                cmd = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except (OSError, ValueError):
                continue
            fields = stat.rsplit(")", 1)[1].split()  # after "(comm)": state, ppid, ...
            if int(fields[1]) == self.popen.pid and fields[0] != "Z":
                out[int(entry.name)] = cmd
        return out

    def pid_of(self, kind: str) -> int | None:
        marks = KINDS[kind][0]
        pids = [pid for pid, cmd in self.children().items() if all(m in cmd for m in marks)]
        assert len(pids) <= 1, (kind, pids)
        return pids[0] if pids else None

    def stop(self) -> int:
        if self.popen.poll() is None:
            self.popen.send_signal(signal.SIGINT)
            try:
                self.popen.wait(120)
            except subprocess.TimeoutExpired:
                self.popen.kill()
                self.popen.wait()
        self._reader.join(10)
        self.popen.stdout.close()
        return self.popen.returncode


@pytest.fixture(scope="module")
def up(tmp_path_factory):
    mesh = Up(tmp_path_factory.mktemp("up"))
    try:
        yield mesh
    finally:
        mesh.stop()


def _rows(url: str) -> list[dict]:
    try:
        snap = httpx.get(url + "/v1/mesh", timeout=5).json()
    except (httpx.HTTPError, ValueError):
        return []
    return [dict(row, table=t) for t in ("engines", "traffic_managers", "gateways", "schedulers") for row in snap[t]]


def _row(url: str, where: tuple[str, str, str]) -> dict | None:
    table, field, value = where
    return next((r for r in _rows(url) if r["table"] == table and r.get(field) == value and r["alive"]), None)


def _healthy(url: str) -> bool:
    try:
        return httpx.get(url + "/health", timeout=2).status_code == 200
    except httpx.HTTPError:
        return False


def _completion_works(url: str) -> dict:
    r = httpx.post(url + "/v1/completions", json={"prompt": "after the restart", **BODY}, timeout=60)
    assert r.status_code == 200, r.text
    doc = r.json()
    assert doc["usage"]["completion_tokens"] == 4 and doc["choices"][0]["finish_reason"] == "length", doc
    return doc


def test_the_mesh_serves_before_anything_dies(up):
    assert len(up.children()) == PROCESSES, up.children()
    wait_until(lambda: _healthy(up.url), "/health 200", 60)
    _completion_works(up.url)


@pytest.mark.parametrize("kind", list(KINDS))
def test_a_killed_process_is_restarted_and_the_mesh_serves_again(up, kind):
    with _restarted(up, kind) as old_pid:
        os.kill(old_pid, signal.SIGKILL)
    _completion_works(up.url)  # the same URL: a restarted scheduler serves on the socket up kept


def test_a_stream_in_flight_when_its_decode_engine_dies_does_not_end_the_mesh(up):
    """The stream ends cleanly (resumed, or one error event), never with the scheduler shutting down."""
    body = {"prompt": "in flight " * 8, "max_tokens": 300, "temperature": 0, "ignore_eos": True, "stream": True}
    events = []
    with _restarted(up, "decode engine") as old_pid:
        with httpx.stream("POST", up.url + "/v1/completions", json=body, timeout=60) as r:
            assert r.status_code == 200
            os.kill(old_pid, signal.SIGKILL)
            for line in r.iter_lines():
                if line.startswith("data: "):
                    events.append(line[6:])
    assert events[-1] == "[DONE]"
    assert not any("shutting down" in e for e in events), events[-3:]
    _completion_works(up.url)


@contextmanager
def _restarted(up: Up, kind: str):
    """Yields the pid of the running `kind` process for the caller to kill; then waits until up
    said it exited and restarted it, the new pid is up's child, the new process announced itself
    (nats-server: every service announced through it) and /health is 200."""
    _, where = KINDS[kind]
    old_pid = wait_until(lambda: up.pid_of(kind), f"the {kind} among up's children", 60)
    old_row = wait_until(lambda: _row(up.url, where), f"the {kind} announced", 60) if where else None
    mark = len(up.lines)
    killed_at = time.monotonic()
    yield old_pid

    exited = up.wait_line(r" exited with code -9 \(SIGKILL\) after .* up; restart \d+ in [\d.]+ s \(log: ", mark)
    name = exited.split()[0]
    restarted = up.wait_line(rf"^{re.escape(name)} restarted \(pid (\d+), restart \d+\)$", mark)
    new_pid = int(re.search(r"pid (\d+)", restarted).group(1))
    assert new_pid != old_pid and up.pid_of(kind) == new_pid  # the same kind of process, a new one
    if where:  # the new process announced itself under the same engine / node
        wait_until(lambda: (r := _row(up.url, where)) and r["instance"] != old_row["instance"],
                   f"the restarted {kind} announced", 60)
    if kind == "nats-server":  # every service reconnected to the new server on the same port
        def everyone_heard_since():
            rows = _rows(up.url)
            return len(rows) == PROCESSES - 1 and all(r["age_s"] < time.monotonic() - killed_at for r in rows)
        wait_until(everyone_heard_since, "a heartbeat from every service through the new nats-server", 60)
    wait_until(lambda: _healthy(up.url), f"/health 200 after the {kind} restart", 60)


def test_ctrl_c_stops_every_process_and_reports_the_restarts(up):
    children = up.children()
    assert len(children) == PROCESSES
    assert up.stop() == 0, "\n".join(up.lines)
    assert [pid for pid in children if Path(f"/proc/{pid}").exists()] == []  # reaped, none orphaned
    summary = next(ln for ln in up.lines if ln.startswith("restarts: "))
    counts = dict(re.findall(r"(\S+) (\d+)[,( ]", summary.removeprefix("restarts: ")))
    assert {"decode-d1-e0", "prefill-p0-e0", "tm-d1-e0", "gateway-p0", "scheduler", "nats"} <= counts.keys(), summary
    logs = Path(re.search(r"logs kept: (\S+)\)", summary).group(1))
    assert "--- restart 1 by dualpath up ---" in (logs / "decode-d1-e0.log").read_text()

