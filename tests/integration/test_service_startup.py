"""Start-up as a user meets it: no NATS, stop signals during start-up, taken ports, bad
settings, a process that cannot start, and `dualpath up` from start to Ctrl-C.

Every process here is real (`python -m services.<name>`, `dualpath up`); each test reads
the process's own output until the line it waits for appears (pytest's timeout is the
only deadline). Temporary directories go to the test's own TMPDIR, so a test can see
that a run left nothing behind.
"""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import httpx
import pytest

pytestmark = pytest.mark.integration

SHM = Path("/dev/shm")


@pytest.fixture
def refused():
    """A NATS URL nobody answers: a bound, never-listening socket (connections are refused, and
    no other process can take the port while the test holds it)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        yield f"nats://127.0.0.1:{s.getsockname()[1]}"


@pytest.fixture
def taken():
    """A port with a live listener on it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        yield s.getsockname()[1]


def _env(tmp_path: Path) -> dict[str, str]:
    tmp = tmp_path / "tmpdir"
    tmp.mkdir(exist_ok=True)
    return {**os.environ, "PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp), "DUALPATH_LOG_LEVEL": "info"}


def _service(name: str, *flags: str, tmp_path: Path) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", f"services.{name}", *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(tmp_path))


def _until(stream, pattern: str) -> list[str]:
    """Lines of `stream` up to and including the first matching `pattern` (fails at EOF)."""
    seen = []
    for line in iter(stream.readline, ""):
        seen.append(line)
        if re.search(pattern, line):
            return seen
    pytest.fail(f"no line matching {pattern!r} before the stream ended:\n{''.join(seen)}")


def _segments(pid: int) -> list[str]:
    return [n for n in os.listdir(SHM) if f"-{pid}-" in n]


def test_without_nats_a_service_says_what_it_waits_for_then_gives_up(refused, tmp_path):
    p = _service("storage_gateway", "--nats", refused, "--nats-wait-s", "1.5", "--store", str(tmp_path / "store"),
                 tmp_path=tmp_path)
    out, err = p.communicate()
    assert p.returncode == 1
    assert f"waiting for NATS at {refused}" in err and "retrying every 0.25 s, giving up after 1.5 s" in err
    last = err.strip().splitlines()[-1]
    assert last.startswith(f"storage_gateway: error: no NATS server at {refused} within 1.5 s"), last
    assert "Traceback" not in err


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_a_stop_signal_while_waiting_for_nats_stops_it_and_unlinks_its_shared_memory(refused, tmp_path, sig):
    # a traffic-manager creates its DRAM buffer (POSIX shm) before it connects; wait forever for NATS
    p = _service("traffic_manager", "--nats", refused, "--nats-wait-s", "0", "--engine", "e0", "--buffer-mb", "8",
                 tmp_path=tmp_path)
    try:
        _until(p.stderr, "waiting for NATS")
        assert _segments(p.pid), "the buffer should exist while it waits"
        p.send_signal(sig)
        p.communicate()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    assert p.returncode == 0
    assert _segments(p.pid) == []


def _thread_nice(pid: int) -> list[int]:
    """The niceness of each of a process's threads (field 19 of /proc/<pid>/task/<tid>/stat)."""
    out = []
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            stat = Path(f"/proc/{pid}/task/{tid}/stat").read_text()
        except FileNotFoundError:  # a thread that ended between the listing and the read
            continue
        out.append(int(stat.rsplit(")", 1)[1].split()[16]))
    return out


@pytest.mark.parametrize("flags,want", [(("--nice", "3"), 3), ((), 0)], ids=["set", "default"])
def test_a_traffic_manager_runs_every_thread_at_its_niceness(refused, tmp_path, flags, want):
    base = os.getpriority(os.PRIO_PROCESS, 0)  # niceness is added to what the process was started with
    p = _service("traffic_manager", "--nats", refused, "--nats-wait-s", "0", "--engine", "e0", "--buffer-mb", "8",
                 *flags, tmp_path=tmp_path)
    try:
        _until(p.stderr, "waiting for NATS")  # past start-up: its threads are running
        nice = _thread_nice(p.pid)
        assert len(nice) >= 2, nice  # the event loop's and at least one started before or after the change
        assert set(nice) == {min(19, base + want)}, nice
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate()


def test_a_niceness_outside_0_to_19_fails_before_connecting(refused, tmp_path):
    p = _service("traffic_manager", "--nats", refused, "--nats-wait-s", "1", "--engine", "e0", "--nice", "20",
                 tmp_path=tmp_path)
    out, err = p.communicate()
    assert p.returncode == 2
    assert "nice" in err and "0..19" in err and "20" in err, err
    assert "waiting for NATS" not in err and "Traceback" not in err


def test_a_running_service_stops_on_one_sigterm_with_exit_code_0(tmp_path):
    from tests.integration.natsutil import NatsServer

    nats = NatsServer(tmp_path).start()
    p = _service("storage_gateway", "--nats", nats.url, "--store", str(tmp_path / "store"), tmp_path=tmp_path)
    try:
        _until(p.stderr, r"storage_gateway-\w+ started")  # its /metrics server is serving now
        p.send_signal(signal.SIGTERM)
        out, err = p.communicate()
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
        nats.stop()
    assert p.returncode == 0, err  # the HTTP server must not raise the signal again on its way out
    assert "second SIGTERM" not in err


def test_a_taken_http_port_fails_at_once_naming_the_port_and_the_flag(refused, taken, tmp_path):
    p = _service("scheduler", "--model", "tiny", "--nats", refused, "--nats-wait-s", "1", "--http-port", str(taken),
                 tmp_path=tmp_path)
    out, err = p.communicate()
    assert p.returncode == 1
    assert err.strip().splitlines()[-1] == f"scheduler: error: port {taken} on 127.0.0.1 is in use; " \
                                           "pick another with --http-port"
    assert "waiting for NATS" not in err  # checked before the first connection attempt
    assert "Traceback" not in err


def test_a_taken_metrics_port_names_the_metrics_flag(refused, taken, tmp_path):
    p = _service("storage_gateway", "--nats", refused, "--nats-wait-s", "1", "--metrics-port", str(taken), "--store",
                 str(tmp_path / "store"), tmp_path=tmp_path)
    out, err = p.communicate()
    assert p.returncode == 1
    assert f"port {taken} on 127.0.0.1 is in use; pick another with --metrics-port" in err
    assert "waiting for NATS" not in err


def test_a_common_setting_not_every_service_has_fails_before_connecting(refused, tmp_path):
    cfg = tmp_path / "dualpath.toml"
    cfg.write_text('[common]\nmodel = "tiny"\n')  # an engine/scheduler setting: the gateway has none
    p = _service("storage_gateway", "--config", str(cfg), "--nats", refused, "--nats-wait-s", "1", "--store",
                 str(tmp_path / "s"), tmp_path=tmp_path)
    out, err = p.communicate()
    assert p.returncode == 2
    assert "bad setting common.model='tiny'" in err and "not a setting of every service" in err
    assert "waiting for NATS" not in err


def _up(tmp_path: Path, *flags: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "dualpath.cli", "up", *flags], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=_env(tmp_path), cwd=Path(__file__).parents[2])


def _stop_up(p: subprocess.Popen) -> None:
    """After a failed assertion: Ctrl-C, so `dualpath up` stops its children (SIGKILL would orphan them)."""
    if p.poll() is None:
        p.send_signal(signal.SIGINT)
        try:
            p.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def test_up_on_a_taken_port_is_one_line_and_leaves_nothing_behind(taken, tmp_path):
    p = _up(tmp_path, "--model", "tiny", "--port", str(taken))
    out, err = p.communicate()
    assert p.returncode == 1
    assert err.strip() == f"dualpath up: port {taken} on 127.0.0.1 is in use; pick another with --port"
    assert list((tmp_path / "tmpdir").iterdir()) == []


def test_up_names_the_log_of_a_process_that_cannot_start_and_keeps_it(tmp_path):
    p = _up(tmp_path, "--model", str(tmp_path / "missing.gguf"), "--port", "0")  # no such model: nothing starts
    out, err = p.communicate()
    assert p.returncode == 1
    line = err.strip()
    m = re.fullmatch(r"dualpath up: (\S+) exited with code 1 \(log: (\S+\.log)\)", line)
    assert m, err
    assert "Traceback" not in err
    log = Path(m.group(2))
    assert log.is_relative_to(tmp_path / "tmpdir") and "unknown model spec" in log.read_text()
    p = _up(tmp_path, "--model", str(tmp_path / "missing.gguf"), "--port", "0", "--debug")
    out, err = p.communicate()
    assert p.returncode == 1 and "Traceback" in err and "--- last lines of" in err


def test_up_prints_serving_only_when_a_completion_succeeds_and_cleans_up_on_ctrl_c(tmp_path):
    p = _up(tmp_path, "--model", "tiny", "--port", "0", "--kv-blocks", "32")
    try:
        lines = _until(p.stdout, r"^serving ")
        url = re.match(r"serving (\S+)", lines[-1]).group(1)
        # warmed up before the line: one small chat completion per engine, answered
        assert "warming up the engines (1 small chat completion) ...\n" in lines
        assert any(re.fullmatch(r"warm-up: done in \d+\.\d s\n", ln) for ln in lines), lines
        metrics = httpx.get(url + "/metrics", timeout=30).text
        assert re.search(r'^dualpath_scheduler_requests_total\{status="ok"\} 1\.0$', metrics, re.M), metrics
        r = httpx.post(url + "/v1/completions", json={"prompt": "Once upon a time", "max_tokens": 4}, timeout=60)
        assert r.status_code == 200, r.text  # the first request after the line is served
        logs = Path(re.search(r"logs: (\S+?),", lines[0]).group(1))
        assert logs.is_dir()
        # the transport chosen and why: said by `up`, and by every traffic manager in its log
        said = [ln.rstrip() for ln in lines if ln.startswith("data plane: ")]
        assert len(said) == 1 and re.fullmatch(r"data plane: (tcp|verbs) transport \(auto: .+\)", said[0]), lines
        tms = sorted(logs.glob("tm-*.log"))
        assert tms, sorted(logs.iterdir())
        for tm in tms:
            assert re.search(r"data plane: (tcp|verbs) transport \(auto: .+\)", tm.read_text()), tm.name
            assert "(nice +10)" in tm.read_text(), tm.name  # a mesh on one host: the engines have the cores first
        p.send_signal(signal.SIGINT)
        out, err = p.communicate()
    finally:
        _stop_up(p)
    assert p.returncode == 0, err
    assert "stopping ..." in out
    assert not logs.exists() and list((tmp_path / "tmpdir").iterdir()) == []
